"""The supervisors under test: S ``pgfence run`` subprocesses.

Each runs in a session of its own (a Ctrl-C in the terminal reaches the load
test alone, which stops them in order), with the DSN in its environment
(never on a command line), its own metrics port and metrics directory, a
log file, and every ``PGFENCE_*`` setting of the caller's environment
removed so that the run is what its options say.  Its worker children and
heartbeat manager are found by their process titles, as ``ps`` shows them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from prometheus_client.parser import text_string_to_metric_families

from pgfence.errors import PgfenceError
from pgfence.tools.loadtest.pgbouncer import free_port

def children(pid: int) -> list[int]:
    """The children of ``pid`` (Linux /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except OSError:
        pass
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


#: One scrape of /metrics: (sample name, sorted label pairs) to value.
Scrape: TypeAlias = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Scrape:
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@dataclass
class Supervisor:
    index: int
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    exit_status: int | None = None
    exited_early: bool = False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def processes(self) -> list[tuple[int, str]]:
        return [(pid, title(pid)) for pid in children(self.proc.pid)]

    def workers(self) -> list[tuple[int, str]]:
        return [(pid, t) for pid, t in self.processes() if t.startswith("pgfence worker ")]

    def heartbeat(self) -> int | None:
        return next((pid for pid, t in self.processes() if t.startswith("pgfence heartbeat")), None)

    def scrape(self) -> Scrape | None:
        status, text = http_get(self.url("/metrics"))
        return parse_metrics(text) if status == 200 else None

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


class Fleet:
    def __init__(self, *, count: int, workers: int, batch: int | None, threads: int, async_concurrency: int,
                 handlers: list[str], queue: str, lease: float, poll_interval: float, graceful: float,
                 dsns: list[str], mail_url: str, listen: bool, unprotected: bool, workdir: Path, log_dir: Path,
                 env: dict[str, str] | None = None):
        self.count = count
        #: Set for the supervisors besides the DSN and the email API (the
        #: limited kinds the load test's handlers register).
        self.extra_env = dict(env or {})
        # No --batch: each worker claims up to its free slots.
        self.args = ["--workers", str(workers), *(["--batch", str(batch)] if batch is not None else []),
                     "--threads", str(threads), "--async-concurrency", str(async_concurrency),
                     "--queues", queue, "--lease", f"{lease:g}",
                     "--poll-interval", f"{poll_interval:g}", "--graceful-timeout", f"{graceful:g}",
                     "--handlers", ",".join(handlers), "--metrics-host", "127.0.0.1", "--log-level", "INFO"]
        if not listen:
            # Transaction pooling: no session to LISTEN on or to keep plans in.
            self.args += ["--no-listen", "--no-prepare"]
        if unprotected:
            self.args.append("--unprotected")
        self.dsns = dsns   # one per supervisor: each its own link through the proxy
        self.mail_url = mail_url
        self.workdir = workdir
        self.log_dir = log_dir
        self.supervisors: list[Supervisor] = []

    def _env(self, dsn: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGFENCE_") and k != "DATABASE_URL"}
        env.update(PGFENCE_DSN=dsn, PGFENCE_EMAIL_API_URL=self.mail_url, PYTHONUNBUFFERED="1")
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        for index in range(self.count):
            port = free_port()
            log = self.log_dir / f"supervisor-{index}.log"
            metrics_dir = self.workdir / f"metrics-{index}"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "pgfence", "run", *self.args, "--metrics-port", str(port),
                     "--metrics-dir", str(metrics_dir)],
                    env=self._env(self.dsns[index]), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            self.supervisors.append(Supervisor(index, port, proc, log))

    def wait_ready(self, timeout: float) -> None:
        """Until every supervisor's /readyz says 200 (database answers, all
        workers up); a supervisor that exits is an error."""
        deadline = time.monotonic() + timeout
        waiting = list(self.supervisors)
        while waiting:
            for s in list(waiting):
                if not s.alive():
                    raise PgfenceError(f"supervisor {s.index} exited with status {s.proc.returncode} at start: "
                                       f"{s.tail()}")
                if http_get(s.url("/readyz"), timeout=2)[0] == 200:
                    waiting.remove(s)
            if waiting and time.monotonic() > deadline:
                raise PgfenceError(f"{len(waiting)} supervisor(s) not ready within {timeout:g}s: "
                                   f"{waiting[0].tail()}")
            time.sleep(0.1)

    def note_exits(self) -> None:
        """Record supervisors that stopped on their own while the run went on."""
        for s in self.supervisors:
            if s.exit_status is None and not s.alive():
                s.exit_status, s.exited_early = s.proc.returncode, True

    def all_idle(self) -> bool:
        return all(t.endswith(" idle") for s in self.supervisors if s.alive() for _pid, t in s.workers())

    def stop(self, s: Supervisor, timeout: float) -> None:
        """SIGCONT its processes (a stopped one cannot drain), then SIGTERM:
        a graceful drain; SIGKILL of the whole session past ``timeout``."""
        for pid, _t in s.processes():
            _signal(pid, signal.SIGCONT)
        if s.alive():
            s.proc.send_signal(signal.SIGTERM)
            try:
                s.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal(-s.proc.pid, signal.SIGKILL)
                s.proc.wait()
        if s.exit_status is None:
            s.exit_status = s.proc.returncode
        # Children tied to the arbiter leave with it; anything left in its
        # session is killed.
        _signal(-s.proc.pid, signal.SIGKILL)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cleanup on the way out (a no-op after :meth:`stop`): a fast stop
        (SIGINT: children killed, their jobs released at once) of every
        supervisor still running, then SIGKILL of each session."""
        running = [s for s in self.supervisors if s.alive()]
        for s in running:
            for pid, _t in s.processes():
                _signal(pid, signal.SIGCONT)
            s.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        for s in running:
            # One still running after the deadline is killed below.
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(max(0.0, deadline - time.monotonic()))
        for s in self.supervisors:
            _signal(-s.proc.pid, signal.SIGKILL)
            if s.proc.poll() is None:
                s.proc.wait()


def _signal(pid: int, sig: int) -> None:
    # The process may have exited meanwhile: nothing left to signal.
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
