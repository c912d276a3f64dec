"""Prometheus multiprocess mode, set up before prometheus_client is imported.

Under ``pgfence run`` every process (workers, heartbeat manager, arbiter)
writes its metrics to files in one directory, and the metrics server sums
them.  prometheus_client decides at import time whether it runs in this mode,
so :func:`prepare` must run in the arbiter before anything imports it, and
before any fork.  This module therefore imports nothing of prometheus_client.

The directory is wiped at start (files left by a previous run would be summed
into this one's), so pgfence only ever wipes a directory of its own: one it
created, or an empty one it was given, both marked by :data:`MARKER`.  A
directory that holds anything else is refused: a mistyped ``--metrics-dir``
once deleted a user's SQLite database.

Without ``--metrics-dir`` (and outside systemd's RuntimeDirectory) each run
makes a temp folder of its own, ``pgfence-metrics-*``, and deletes it when
it stops.  An arbiter killed by SIGKILL cannot: its folder says who made it
(:data:`OWNER`: host, pid and the process's start time), and the next run
on the host sweeps the folders whose maker is gone (:func:`sweep`): never
one whose arbiter runs, one made on another host (a container's pids are
not this one's), another user's, or one holding a file pgfence did not
write.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import sys
import tempfile
from pathlib import Path

from pgfence.errors import ConfigError

ENV = "PROMETHEUS_MULTIPROC_DIR"

#: The file that marks a metrics directory as pgfence's own.
MARKER = ".pgfence-metrics"
_MARKER_TEXT = ("This directory holds the metric files of 'pgfence run', which deletes them at each start.\n"
                "Keep nothing else here.\n")
#: In a temp folder a run made: ``host pid start`` of its arbiter.
OWNER = ".pgfence-owner"
#: The names of the temp folders runs make.
PREFIX = "pgfence-metrics-"
#: prometheus_client's multiprocess files: counter_<pid>.db, gauge_<mode>_<pid>.db, ...
METRIC_FILE = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")

log = logging.getLogger("pgfence.arbiter")


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), ""
    where that cannot be read but the process exists, None if there is no
    such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


def owner_line(pid: int) -> str:
    """What :data:`OWNER` holds for the arbiter ``pid``."""
    return f"{socket.gethostname()} {pid} {process_start(pid) or '-'}\n"


def owner_gone(text: str) -> bool:
    """Whether the arbiter an :data:`OWNER` file names has surely ended: on
    this host, and its pid gone or now another process's."""
    try:
        host, pid, start = text.split()
        number = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    now = process_start(number)
    return now is None or (start != "-" and now not in ("", start))


def sweep(parent: Path) -> list[Path]:
    """Delete the ``pgfence-metrics-*`` folders in ``parent`` whose arbiter
    is gone (this user's, marked, holding only pgfence's files); return them."""
    swept = []
    for folder in sorted(parent.glob(PREFIX + "*")):
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            names = {entry.name for entry in folder.iterdir()}
            if MARKER not in names or OWNER not in names or not owner_gone((folder / OWNER).read_text()):
                continue
            if any(not METRIC_FILE.match(name) for name in names - {MARKER, OWNER}):
                continue
            for name in [*sorted(names - {OWNER}), OWNER]:
                (folder / name).unlink()
            folder.rmdir()
        except OSError:
            continue   # gone already, or not ours to delete: left as it is
        swept.append(folder)
    return swept


def default_dir() -> Path:
    """systemd's RuntimeDirectory when there is one, else a private temp dir
    (see :func:`sweep_gone` for those of runs killed before they could
    delete theirs)."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        return Path(runtime.split(":")[0]) / "metrics"
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=tempfile.gettempdir()))
    (path / MARKER).write_text(_MARKER_TEXT)
    (path / OWNER).write_text(owner_line(os.getpid()))
    return path


def sweep_gone() -> None:
    """Delete the temp metrics folders of supervisors that are gone, once
    this run's settings, handlers and database were found good (a run
    refused for bad input changes nothing and says one line)."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return
    swept = sweep(Path(tempfile.gettempdir()))
    if swept:
        log.info("deleted %d metrics folder(s) of supervisors that are gone: %s", len(swept),
                 ", ".join(folder.name for folder in swept))


def claim_dir(path: Path) -> list[Path]:
    """Make ``path`` pgfence's metrics directory and wipe the metric files a
    previous run left there; return the files deleted.

    A missing directory is created and an empty one taken, both marked as
    pgfence's own; a marked one has its metric files (and only those)
    deleted.  An unmarked directory that holds anything raises
    :class:`ConfigError`, and nothing in it is touched."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        marker = path / MARKER
        if not marker.exists():
            foreign = sorted(entry.name for entry in path.iterdir())
            if foreign:
                shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                raise ConfigError(f"invalid metrics-dir {str(path)!r}: it holds files pgfence did not create "
                                  f"({shown}), and pgfence deletes the files of its metrics directory at each "
                                  "start; give a new or empty directory")
            marker.write_text(_MARKER_TEXT)
        stale = [entry for entry in path.iterdir() if METRIC_FILE.match(entry.name) and entry.is_file()]
        for old in stale:
            old.unlink()
    except OSError as exc:
        raise ConfigError(f"invalid metrics-dir {str(path)!r}: {exc.strerror or exc}") from None
    return stale


def prepare(directory: str | None) -> Path:
    """Create (or wipe) the metrics directory and point prometheus_client at it."""
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the metrics directory was set")
    path = Path(directory) if directory else default_dir()
    claim_dir(path)
    os.environ[ENV] = str(path)
    return path
