"""The demo's cast: the email API its receipt jobs call and the two
``pgfence work`` processes, demo-A and demo-B, that run them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pgfence.tools.mailsink import MailSink


class Sink(MailSink):
    """The email API, with a hook called on each POST before it is answered
    (act 3 freezes the sender there, between its send and its commit)."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", 0)
        self.on_post: Callable[[int | None], None] | None = None
        sink = self
        base = self.server.RequestHandlerClass

        class Hooked(base):  # type: ignore[misc, valid-type]
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                hook = sink.on_post
                if hook is not None:
                    try:
                        attempt = int(self.headers.get("X-Pgfence-Attempt") or "")
                    except ValueError:
                        attempt = None
                    hook(attempt)
                super().do_POST()

        self.server.RequestHandlerClass = Hooked


class Worker:
    """One ``pgfence work`` subprocess; its log goes to a file."""

    def __init__(self, name: str, *, protected: bool, lease: float, queue: str,
                 env: dict[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        args = [sys.executable, "-m", "pgfence", "work", "--name", name, "--queues", queue,
                "--lease", repr(float(lease)), "--poll-interval", "0.2",
                "--handlers", "pgfence.handlers.receipts", "--retention", "none", "--log-level", "INFO"]
        if not protected:
            args.append("--unprotected")
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=log_path.parent, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def worker_env(dsn: str, api_url: str) -> dict[str, str]:
    """The caller's environment without pgfence settings (the demo sets its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGFENCE_") and k != "DATABASE_URL"}
    env["PGFENCE_DSN"] = dsn
    env["PGFENCE_EMAIL_API_URL"] = api_url
    env["PYTHONUNBUFFERED"] = "1"
    return env
