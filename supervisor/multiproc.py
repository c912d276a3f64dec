"""Prometheus multiprocess mode, set up before prometheus_client is imported.

Under ``pgfence run`` every process (workers, heartbeat manager, arbiter)
writes its metrics to files in one directory, and the metrics server sums
them.  prometheus_client decides at import time whether it runs in this mode,
so :func:`prepare` must run in the arbiter before anything imports it, and
before any fork.  This module therefore imports nothing of prometheus_client.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from .errors import ConfigError

ENV = "PROMETHEUS_MULTIPROC_DIR"


def default_dir() -> Path:
    """systemd's RuntimeDirectory when there is one, else a private temp dir."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        return Path(runtime.split(":")[0]) / "metrics"
    return Path(tempfile.mkdtemp(prefix="pgfence-metrics-"))


def prepare(directory: str | None) -> Path:
    """Create (or wipe) the metrics directory and point prometheus_client at it."""
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the metrics directory was set")
    path = Path(directory) if directory else default_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Files left by a previous run would be summed into this one's.
        for old in path.glob("*.db"):
            old.unlink()
    except OSError as exc:
        raise ConfigError(f"invalid metrics-dir {str(path)!r}: {exc.strerror or exc}") from None
    os.environ[ENV] = str(path)
    return path
