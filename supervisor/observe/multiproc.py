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
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from pgfence.errors import ConfigError

ENV = "PROMETHEUS_MULTIPROC_DIR"

#: The file that marks a metrics directory as pgfence's own.
MARKER = ".pgfence-metrics"
_MARKER_TEXT = ("This directory holds the metric files of 'pgfence run', which deletes them at each start.\n"
                "Keep nothing else here.\n")
#: prometheus_client's multiprocess files: counter_<pid>.db, gauge_<mode>_<pid>.db, ...
METRIC_FILE = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_\d+\.db$")


def default_dir() -> Path:
    """systemd's RuntimeDirectory when there is one, else a private temp dir."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        return Path(runtime.split(":")[0]) / "metrics"
    return Path(tempfile.mkdtemp(prefix="pgfence-metrics-"))


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
