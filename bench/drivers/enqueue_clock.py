"""The clock of the enqueue section's drivers (``drivers.pgfence_enqueue``,
run by the project's interpreter, and ``drivers.enqueue_peers``, by the
benchmark's): standard library and psycopg only, so both can import it.

A driver warms up (connections open, statements prepared), starts the clock,
enqueues N jobs, stops it and prints one JSON line: the wall time of the
calls; the CPU time of its own process (user + system, every thread); the
CPU time of the server side over the same span (each PostgreSQL backend of
the database but the clock's own, from /proc/PID/stat, so the server must
run on this machine; or redis-server's); and the whole machine's busy and
total CPU time, from which the harness tells a disturbed run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psycopg

# The benchmark's own /proc readers (drivers run from bench/, where harness is).
from harness import cpu_seconds
from harness import machine_busy as machine

_BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")


def _own() -> float:
    t = os.times()
    return t.user + t.system


def _redis_pids() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "redis-server":
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


class Clock:
    """The timed span of one run.  ``dsn``: count the database's backends as
    the server; None: redis-server."""

    def __init__(self, dsn: str | None):
        self.monitor = psycopg.connect(dsn, autocommit=True) if dsn else None

    def _server_pids(self) -> list[int]:
        if self.monitor is None:
            return _redis_pids()
        return [pid for (pid,) in self.monitor.execute(_BACKENDS).fetchall()]

    def start(self) -> None:
        self.base = {pid: cpu_seconds(pid) for pid in self._server_pids()}
        self.machine0 = machine()
        self.own0 = _own()
        self.t0 = time.perf_counter()

    def stop(self, jobs: int, **extra: object) -> dict:
        wall = time.perf_counter() - self.t0
        own = _own() - self.own0
        pids = self._server_pids()
        # A backend opened during the span counts from its start.
        server = sum(cpu_seconds(pid) - self.base.get(pid, 0.0) for pid in pids)
        m1 = machine()
        if self.monitor is not None:
            self.monitor.close()
        return {"jobs": jobs, "wall_s": wall, "client_s": own, "server_s": server, "backends": len(pids),
                "busy_s": m1[0] - self.machine0[0], "total_s": m1[1] - self.machine0[1], **extra}


def report(result: dict) -> None:
    print(json.dumps(result), flush=True)
