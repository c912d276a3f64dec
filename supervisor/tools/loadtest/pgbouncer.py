"""PgBouncer in transaction pooling, in front of the server, for ``--pgbouncer``.

A generated ini in the run's temp dir: listen on a free port of 127.0.0.1
only (no Unix socket), ``pool_mode = transaction``, ``max_client_conn =
600``, ``default_pool_size = 20``, ``auth_type = trust`` with a userlist
naming the one user.  The server side goes through the load test's proxy,
so a partition cuts PgBouncer off the server and the ``terminate`` fault sees
its server connections.  PgBouncer refuses to run as root: as root it is
started with ``-u nobody`` and its files are handed to that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from pgfence.errors import PgfenceError

USER_WHEN_ROOT = "nobody"


def find() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer") if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PgBouncer:
    def __init__(self, workdir: Path, *, server_port: int, dbname: str, user: str, password: str | None):
        self.dir = workdir / "pgbouncer"
        self.server_port = server_port
        self.dbname = dbname
        self.user = user
        self.password = password
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def ini(self) -> str:
        server = f"host=127.0.0.1 port={self.server_port} dbname={_quote(self.dbname)} user={_quote(self.user)}"
        if self.password:
            server += f" password={_quote(self.password)}"
        return "\n".join([
            "[databases]",
            f"{self.dbname} = {server}",
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.dir / 'userlist.txt'}",
            "pool_mode = transaction",
            "max_client_conn = 600",
            "default_pool_size = 20",
            "server_tls_sslmode = disable",
            # The heartbeat manager sets its statement timeout with the
            # `options` startup parameter, which PgBouncer 1.18 refuses.
            "ignore_startup_parameters = extra_float_digits,options",
            "",
        ])

    def start(self, timeout: float = 15.0) -> int:
        program = find()
        if program is None:
            raise PgfenceError("pgbouncer not found")
        self.dir.mkdir(mode=0o700)
        self.port = free_port()
        (self.dir / "pgbouncer.ini").write_text(self.ini())
        quoted_user = self.user.replace('"', '""')
        (self.dir / "userlist.txt").write_text(f'"{quoted_user}" ""\n')
        command = [program]
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER_WHEN_ROOT)
            for path in (self.dir, self.dir / "pgbouncer.ini", self.dir / "userlist.txt"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(self.dir.parent, 0o711)   # let it reach its own folder
            command += ["-u", USER_WHEN_ROOT]
        for name in ("pgbouncer.ini", "userlist.txt"):
            os.chmod(self.dir / name, 0o600)
        with open(self.dir.parent / "pgbouncer.log", "wb") as log:
            self.proc = subprocess.Popen([*command, str(self.dir / "pgbouncer.ini")], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PgfenceError(f"pgbouncer exited with status {self.proc.returncode}: {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self.port
            except OSError:
                time.sleep(0.05)
        raise PgfenceError(f"pgbouncer did not listen on 127.0.0.1:{self.port} within {timeout:g}s: {self.tail()}")

    def tail(self) -> str:
        try:
            lines = (self.dir.parent / "pgbouncer.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
