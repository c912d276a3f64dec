"""What the claiming thread watches between its claims: a job past its
timeout (an async one is cancelled), a handler that outlives its lease by
the grace period (given up: released, or retried as a timeout, and under
``pgfence run`` the worker stops claiming and exits to be replaced once its
other jobs end), and an event loop held by blocking code.

A handler that outlives its lease cannot be stopped from outside: a thread
cannot be killed, and a loop held by blocking code turns no more.  So one
stuck handler does not end its neighbours' jobs, its job is given up
``lost_lease_kill_after`` seconds later and the worker is recycled
(:data:`pgfence.prefork.child.RECYCLED`).  In the one-job slot the handler
runs on the claiming thread itself, which then watches nothing: there the
renewal process's timeout grace ends the child.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from pgfence import errortext
from pgfence.job import JobBase
from pgfence.observe import metrics
from pgfence.settings import Settings
from pgfence.worker.aio import BLOCKED_AFTER
from pgfence.worker.lease import LeaseTracker
from pgfence.worker.slots import Flight, LoopSlots

log = logging.getLogger("pgfence.worker")


class Watching:
    """The engine's part that watches its jobs (see the module's docstring)."""

    name: str
    settings: Settings
    heartbeat: LeaseTracker | None
    recycle: bool
    recycle_reason: str | None
    loop_slots: LoopSlots | None
    _lock: threading.Lock
    _flights: dict[tuple[int, int], Flight]
    _watched_at: float | None
    _watch_from: float
    _blocked_reported: bool

    if TYPE_CHECKING:   # the engine's, from Outcomes
        def _fail(self, job: JobBase, error: str, *, final: bool, exc: BaseException | None = None,
                  outcome: str = "error") -> str:
            raise NotImplementedError

        def release(self, job: JobBase, *, reclaim: bool = False, reason: str | None = None,
                    retry_later: bool = False, detail: str | None = None) -> bool:
            raise NotImplementedError

    def tend(self) -> None:
        """Cancel async jobs past their timeout, give up handlers that
        outlive their lease by the grace period, report a blocked loop."""
        now = time.monotonic()
        grace = self.settings.lost_lease_kill_after
        with self._lock:
            flights = [f for f in self._flights.values() if not f.abandoned]
        for flight in flights:
            lease = flight.job.lease
            reason = lease.lost()
            if reason is None:
                continue
            if reason == "timeout" and flight.is_async and not flight.cancelled and flight.task is not None:
                flight.cancelled = True
                assert self.loop_slots is not None
                self.loop_slots.cancel(flight)
            since = lease.lost_at
            if reason == "timeout" and lease.started_at is not None and lease.timeout is not None:
                since = lease.started_at + lease.timeout
            if now >= since + grace:
                self._abandon(flight, reason)
        self._watch_loop(now)

    def _abandon(self, flight: Flight, reason: str) -> None:
        job = flight.job
        flight.abandoned = True
        what = "replacing this worker once its other jobs end" if self.recycle else "its thread stays taken"
        log.warning("job %s (%s) attempt %s: its handler still runs %gs after its lease was lost (%s): giving the "
                    "job up; %s", job.id, errortext.one_line(job.kind), job.attempt,
                    self.settings.lost_lease_kill_after, reason, what)
        if reason == "timeout":
            self._fail(job, f"timed out after {job.lease.timeout:g}s; worker recycled", final=False,
                       outcome="timeout")
        elif reason in ("renewal_failed", "expired"):
            self.release(job, retry_later=True, detail=f"lease lost ({reason}) and its handler still ran "
                                                       f"{self.settings.lost_lease_kill_after:g}s later: given up")
        if self.heartbeat is not None:
            self.heartbeat.untrack(job.lease)
        if self.recycle and self.recycle_reason is None:
            self.recycle_reason = "timeout" if reason == "timeout" else "lost_lease"

    def _watch_loop(self, now: float) -> None:
        if self.loop_slots is None or self.loop_slots.loop is None:
            return
        loop = self.loop_slots.loop
        previous, self._watched_at = self._watched_at, now
        if previous is not None and now - previous > BLOCKED_AFTER:
            # This thread did not look for that long either: the whole
            # process stood still (SIGSTOP, a suspended machine) or this
            # thread waited on the database.  The loop was not seen blocked
            # meanwhile, and after a resume this thread may look before the
            # loop's first turn (which runs the timers that fell due while
            # stopped): its silence counts from now.
            self._watch_from = now
        silent = loop.silent_for(now, since=self._watch_from)
        if silent <= BLOCKED_AFTER:
            self._blocked_reported = False
            return
        if self._blocked_reported:
            return
        self._blocked_reported = True
        task = loop.running_task()
        with self._lock:
            culprit = next((f for f in self._flights.values() if f.task is task and task is not None), None)
        if culprit is None:
            kind, detail = "unknown", "code outside any job"
        else:
            kind = culprit.job.kind
            detail = f"{errortext.one_line(kind)} job {culprit.job.id} attempt {culprit.job.attempt}"
        log.warning("event loop of worker %s blocked for %.1fs (and counting) by %s: an async handler runs blocking "
                    "code (await it, or make the handler a def)", self.name, silent, detail)
        metrics.EVENT_LOOP_BLOCKED.labels(kind).inc()
