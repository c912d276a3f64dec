"""Faults, injected at seeded random times while the jobs run.

The schedule comes from ``random.Random(seed)``: faults are drawn in rounds,
each round every enabled fault once in a random order, the gap before each
drawn from half to one and a half of ``--fault-interval``; so the first
round injects every enabled fault once, and the same seed gives the same
sequence of faults, gaps and durations.  Which process or connection a
fault hits depends on what is running at that moment (a second generator,
seeded from the same seed, picks among them); a fault that finds nothing to
hit is tried again a quarter second later.

- ``stop``: SIGSTOP of a worker child (one running a job if any), for 1.5 to
  2.5 leases, then SIGCONT; a child that runs many jobs at once (threads, an
  event loop) stops with all of them, and the event records how many its
  title showed (``jobs``);
- ``kill``: SIGKILL of a worker child (one running a job if any), with
  every job it holds;
- ``kill-heartbeat``: SIGKILL of a supervisor's heartbeat manager;
- ``terminate``: ``pg_terminate_backend`` of a quarter of the worker
  connections (at least one) and of one heartbeat connection, chosen among
  the backends that the proxy carries, so never anyone else's;
- ``partition``: one proxy link cut (a supervisor's, or PgBouncer's) for 1.5
  to 2.5 leases, then healed;
- ``restart``: a fast restart of the server, only when the load test owns it
  (``--embedded``); otherwise reported as skipped;
- ``xmin``: a session of its own, straight to the server, opens a
  REPEATABLE READ transaction and takes its snapshot, which holds the xmin
  horizon (VACUUM removes no row version that ended after it, so dead
  versions pile up in the claim's path) for ``--xmin-hold`` seconds (or 1.5
  to 2.5 leases), then ends it, as a long report or a forgotten session
  would.  No job is lost or run again because of it: the report shows the
  throughput before, during and after each hold.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgfence.errors import PgfenceError
from pgfence.tools.loadtest import statements as loadtest
from pgfence.tools.loadtest.fleet import Fleet
from pgfence.tools.loadtest.proxy import Proxy
from pgfence.tools.loadtest.server import Server

#: ``pgfence worker 3 idle``, ``pgfence worker 3 send_receipt job 42 attempt 1``;
#: a child that runs many jobs: ``pgfence worker 3 [5/32 jobs] sleep job 42
#: attempt 1`` (the job started last), ``pgfence worker 3 [5/32 jobs]``,
#: ``pgfence worker 3 [0/32 jobs] idle``.
WORKER_TITLE = re.compile(r"^pgfence worker (?P<number>\d+)(?: \[(?P<busy>\d+)/(?P<capacity>\d+) jobs\])?"
                          r"(?: idle| (?P<kind>\S+) job (?P<job>\d+) attempt (?P<attempt>\d+))?$")
RETRY = 0.25

RESTART_SKIPPED = "the load test does not control the server (run with --embedded)"


class Faults:
    def __init__(self, faults: tuple[str, ...], *, seed: int, interval: float, lease: float, fleet: Fleet,
                 proxy: Proxy, server: Server, link_names: list[str], clock_zero: float,
                 xmin_hold: float | None = None):
        self.skipped = {"restart": RESTART_SKIPPED} if "restart" in faults and not server.controlled else {}
        self.enabled = [f for f in faults if f not in self.skipped]
        self.schedule = random.Random(f"pgfence-loadtest-faults:{seed}")
        self.targets = random.Random(f"pgfence-loadtest-targets:{seed}")
        self.interval = interval
        self.lease = lease
        self.fleet = fleet
        self.proxy = proxy
        self.server = server
        self.link_names = link_names
        self.zero = clock_zero
        self.counts = {f: 0 for f in faults}
        self.events: list[dict[str, Any]] = []
        #: Backends ended by the terminate fault, by kind of connection.
        self.terminated = {"worker": 0, "heartbeat": 0}
        self._round: list[str] = []
        self._next_at = clock_zero + self._gap()
        self._undo: list[tuple[float, Callable[[], None]]] = []
        self._stopped: set[int] = set()
        self._conn: psycopg.Connection | None = None
        self.xmin_hold = xmin_hold
        #: The xmin fault's open transactions (one per hold not yet ended).
        self._holders: list[psycopg.Connection] = []

    def _gap(self) -> float:
        return self.schedule.uniform(0.5, 1.5) * self.interval

    def _span(self) -> float:
        return round(self.schedule.uniform(1.5, 2.5) * self.lease, 3)

    @property
    def covered(self) -> bool:
        """Every enabled fault was injected at least once."""
        return all(self.counts[f] >= 1 for f in self.enabled)

    # -- the loop's hook -----------------------------------------------------------

    def tick(self, now: float) -> None:
        for item in [u for u in self._undo if u[0] <= now]:
            self._undo.remove(item)
            item[1]()
        if not self.enabled or now < self._next_at:
            return
        if not self._round:
            self._round = self.schedule.sample(self.enabled, len(self.enabled))
        fault = self._round[0]
        target = getattr(self, "_" + fault.replace("-", "_"))(now)
        if target is None:
            self._next_at = now + RETRY
            return
        self._round.pop(0)
        self.counts[fault] += 1
        self.events.append({"t": round(now - self.zero, 3), "fault": fault, **target})
        self._next_at = now + self._gap()

    def finish(self) -> None:
        """Undo what is still in effect: SIGCONT, heal."""
        for _at, undo in sorted(self._undo, key=lambda u: u[0]):
            undo()
        self._undo.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- targets -----------------------------------------------------------------------

    def _worker(self) -> tuple[int, int, str] | None:
        found = [(s.index, pid, t) for s in self.fleet.supervisors if s.alive()
                 for pid, t in s.workers() if pid not in self._stopped]
        busy = [w for w in found if self._busy(w[2])]
        pool = busy or found
        return self.targets.choice(pool) if pool else None

    @staticmethod
    def _busy(title: str) -> bool:
        m = WORKER_TITLE.match(title)
        if m is None:
            return False
        return int(m["busy"]) > 0 if m["busy"] is not None else m["job"] is not None

    @staticmethod
    def _job_of(title: str) -> dict[str, Any]:
        """The job the title names (for a child that runs many, the one it
        started last) and, for such a child, its jobs in flight."""
        m = WORKER_TITLE.match(title)
        out: dict[str, Any] = {"job": None}
        if m and m["job"]:
            out = {"kind": m["kind"], "job": int(m["job"]), "attempt": int(m["attempt"])}
        if m and m["busy"] is not None:
            out["jobs"] = int(m["busy"])
        return out

    # -- the faults ----------------------------------------------------------------------

    def _stop(self, now: float) -> dict[str, Any] | None:
        picked = self._worker()
        if picked is None:
            return None
        index, pid, title = picked
        seconds = self._span()
        _signal(pid, signal.SIGSTOP)
        self._stopped.add(pid)

        def resume() -> None:
            _signal(pid, signal.SIGCONT)
            self._stopped.discard(pid)

        self._undo.append((now + seconds, resume))
        return {"supervisor": index, "pid": pid, "seconds": seconds, **self._job_of(title)}

    def _kill(self, now: float) -> dict[str, Any] | None:
        picked = self._worker()
        if picked is None:
            return None
        index, pid, title = picked
        _signal(pid, signal.SIGKILL)
        return {"supervisor": index, "pid": pid, **self._job_of(title)}

    def _kill_heartbeat(self, now: float) -> dict[str, Any] | None:
        found = [(s.index, pid) for s in self.fleet.supervisors
                 if s.alive() and (pid := s.heartbeat()) is not None]
        if not found:
            return None
        index, pid = self.targets.choice(found)
        _signal(pid, signal.SIGKILL)
        return {"supervisor": index, "pid": pid}

    def _control(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self.server.connect()
        return self._conn

    def _terminate(self, now: float) -> dict[str, Any] | None:
        ours = sorted(self.proxy.backend_pids())
        if not ours:
            return None
        try:
            rows = loadtest.backends(self._control(), ours, self.server.dbname)
            workers = [(b.pid, b.backend_start) for b in rows if b.application_name.startswith("pgfence worker ")]
            heartbeats = [(b.pid, b.backend_start) for b in rows if b.application_name == "pgfence heartbeat"]
            if not workers and not heartbeats:
                return None
            chosen = [("worker", b) for b in
                      (self.targets.sample(workers, max(1, len(workers) // 4)) if workers else [])]
            chosen += [("heartbeat", b) for b in self.targets.sample(heartbeats, min(1, len(heartbeats)))]
            ended = {"worker": 0, "heartbeat": 0}
            for kind, (pid, start) in chosen:
                # The same backend as seen above (pid and start time), or none.
                if loadtest.terminate(self._control(), pid, start):
                    ended[kind] += 1
        except psycopg.Error:
            self._conn = None
            return None
        for kind, n in ended.items():
            self.terminated[kind] += n
        return {"workers": ended["worker"], "heartbeats": ended["heartbeat"]}

    def _partition(self, now: float) -> dict[str, Any] | None:
        links = [link.index for link in self.proxy.links if not link.cut]
        if not links:
            return None
        index = self.targets.choice(links)
        seconds = self._span()
        self.proxy.partition(index)
        self._undo.append((now + seconds, lambda: self.proxy.heal(index)))
        return {"link": self.link_names[index], "seconds": seconds}

    def _restart(self, now: float) -> dict[str, Any] | None:
        started = time.monotonic()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.server.restart()
        return {"seconds": round(time.monotonic() - started, 3)}

    def _xmin(self, now: float) -> dict[str, Any] | None:
        seconds = self.xmin_hold if self.xmin_hold is not None else self._span()
        try:
            holder = self.server.connect("pgfence loadtest xmin")
            holder.autocommit = False
            holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            pid, xmin = loadtest.hold_snapshot(holder)
        except (psycopg.Error, PgfenceError):
            return None    # the server restarts: tried again shortly
        self._holders.append(holder)

        def release() -> None:
            # A restart may have ended the transaction already.
            with contextlib.suppress(psycopg.Error):
                holder.rollback()
            holder.close()
            self._holders.remove(holder)

        self._undo.append((now + seconds, release))
        return {"pid": pid, "xmin": xmin, "seconds": seconds}


def _signal(pid: int, sig: int) -> None:
    # The process may have exited meanwhile: nothing left to signal.
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
