"""The multiprocess collector the metrics server scrapes with, made to
survive one bad file.

A child that has just started may have created its metric file without yet
writing its header, and one killed mid-write leaves a half-written one;
prometheus_client's collector then raises for the whole scrape (and the
HTTP server prints a traceback).  This one reads every file as usual and,
only when that fails, finds the files that cannot be read, leaves them out
of this scrape and logs each once, so that one process's file never costs
the others' metrics.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger("pgfence.metrics")


class TolerantCollector(MultiProcessCollector):
    """:class:`MultiProcessCollector` that skips the files it cannot read."""

    def __init__(self, registry: object, path: str | None = None) -> None:
        super().__init__(registry, path)  # type: ignore[no-untyped-call]
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        files = glob.glob(os.path.join(self._path, "*.db"))
        try:
            return self.merge(files, accumulate=True)  # type: ignore[no-untyped-call,no-any-return]
        except Exception:  # noqa: BLE001 - sorted out file by file below
            pass
        good = [path for path in files if self._readable(path)]
        try:
            return self.merge(good, accumulate=True)  # type: ignore[no-untyped-call,no-any-return]
        except Exception as exc:  # noqa: BLE001 - a file changed between the two reads: the next scrape has it
            log.warning("metrics not collected in this scrape: %s: %s", type(exc).__name__, exc)
            return []

    def _readable(self, path: str) -> bool:
        try:
            self._read_metrics([path])  # type: ignore[no-untyped-call]
            return True
        except FileNotFoundError:
            return False   # gone since the glob: its process ended
        except Exception as exc:  # noqa: BLE001 - empty, half-written or corrupt: struct, JSON or decode errors
            if _empty(path):
                # Created by a process that has just started and not yet
                # sized: it is read at the next scrape, and says nothing wrong.
                log.debug("metrics file %s skipped this scrape: still empty", os.path.basename(path))
                return False
            with self._lock:
                first = path not in self._logged
                self._logged.add(path)
            if first:
                log.warning("metrics file %s skipped, it cannot be read (%s: %s); logged once per file",
                            os.path.basename(path), type(exc).__name__, exc)
            return False


def _empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return True
