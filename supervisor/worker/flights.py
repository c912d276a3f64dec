"""The jobs a worker has in flight, from their dispatch to a slot to their
end: the counts of each side's running and held jobs (which size the next
claim), the in-flight and free-slots gauges, the process title, and the
hand-over of a deferred job to the completer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from pgfence.asyncjob import AsyncJob
from pgfence.job import JobBase
from pgfence.observe import metrics
from pgfence.worker.completion import Completer
from pgfence.worker.lease import LeaseTracker
from pgfence.worker.outcomes import DEFERRED, DONE, Stats
from pgfence.worker.slots import Flight, InlineSlot, LoopSlots, ThreadSlots
from pgfence.worker.wake import Wake

#: Called with the jobs in flight, the capacity, and the job that just
#: started (None when one ended): the process title.
Title = Callable[[int, int, JobBase | None], None]


class InFlight:
    """The engine's part that keeps its jobs in flight."""

    stats: Stats
    heartbeat: LeaseTracker | None
    inline: bool
    capacity: int
    completer: Completer | None
    on_title: Title | None
    sync_slots: InlineSlot | ThreadSlots
    loop_slots: LoopSlots | None
    _lock: threading.Lock
    _flights: dict[tuple[int, int], Flight]
    _running: list[int]
    _held: list[int]
    _dispatched: int
    _finished: int
    _wake: Wake
    #: The free slots the gauge shows now.
    _free_shown: int

    def dispatch_all(self, jobs: Sequence[JobBase]) -> None:
        """Start a claim's jobs in their slots: the ordinary ones in the
        threads (or the one slot, which runs them before this returns), the
        async ones as tasks of the loop."""
        if not jobs:
            return
        flights = [Flight(job, isinstance(job, AsyncJob)) for job in jobs]
        queues: dict[str, int] = {}
        with self._lock:
            for flight in flights:
                self._flights[flight.job.id, flight.job.attempt] = flight
                self._running[flight.is_async] += 1
                queues[flight.job.queue] = queues.get(flight.job.queue, 0) + 1
            self._dispatched += len(flights)
        for queue, count in queues.items():   # once per claim, not per job
            metrics.of(metrics.JOBS_IN_FLIGHT, queue).inc(count)
        loop = [f for f in flights if f.is_async]
        sync = [f for f in flights if not f.is_async]
        if loop:
            assert self.loop_slots is not None
            self._retitle(loop[-1].job)
            self.loop_slots.start(loop)
        if sync:
            if not isinstance(self.sync_slots, InlineSlot):
                self._retitle(sync[-1].job)
            self.sync_slots.start(sync)

    def ended(self, flight: Flight, outcome: str, *, counted: bool = True) -> None:
        """A job's handler returned (on its thread, or on the claiming
        thread for the one slot); ``counted``: its outcome is not yet in the
        stats (run_job counts its own)."""
        self._end(flight, outcome, counted)
        metrics.of(metrics.JOBS_IN_FLIGHT, flight.job.queue).dec()
        if not self.inline:
            self._retitle(None)
            self._wake.set()
        # The one slot's job ended on the claiming thread itself, which needs
        # no wake-up, and the slot stays taken until its claim's batch has
        # run (see InlineSlot.start, which retitles then).

    def ended_together(self, ended: list[tuple[Flight, str]]) -> None:
        """On the loop's thread: the async jobs that ended in one turn of the
        loop, their gauges and histograms updated once for all."""
        queues: dict[str, int] = {}
        durations: dict[tuple[str, str], list[float]] = {}
        completed: dict[tuple[str, str], int] = {}
        for flight, outcome in ended:
            self._end(flight, outcome, True)
            job = flight.job
            queues[job.queue] = queues.get(job.queue, 0) + 1
            durations.setdefault((job.queue, job.kind), []).append(flight.elapsed)
            if outcome == DONE:
                completed[job.queue, job.kind] = completed.get((job.queue, job.kind), 0) + 1
        for queue, count in queues.items():
            metrics.of(metrics.JOBS_IN_FLIGHT, queue).dec(count)
        for (queue, kind), values in durations.items():
            metrics.observe_many(metrics.of(metrics.JOB_DURATION, queue, kind), values)
        for (queue, kind), count in completed.items():
            metrics.of(metrics.JOBS_COMPLETED, queue, kind).inc(count)
        self._retitle(None)
        self._wake.set()

    def record(self, outcome: str) -> None:
        self.stats.add(outcome)

    def _end(self, flight: Flight, outcome: str, counted: bool) -> None:
        job = flight.job
        if counted and outcome != DEFERRED:
            if self.heartbeat is not None:
                self.heartbeat.untrack(job.lease)
            self.stats.add(outcome)
        to_completer = False
        with self._lock:
            self._flights.pop((job.id, job.attempt), None)
            self._running[flight.is_async] -= 1
            self._finished += 1
            if outcome == DEFERRED and not flight.abandoned and (flight.is_async or not self.inline):
                self._held[flight.is_async] += 1
                to_completer = True
        if to_completer:
            assert self.completer is not None
            self.completer.add(job)

    def _settled(self, jobs: list[JobBase]) -> None:
        """The completer's statement for ``jobs`` has run: completed or
        not, their leases are untracked now."""
        on_loop = sum(isinstance(job, AsyncJob) for job in jobs)
        with self._lock:
            self._held[0] -= len(jobs) - on_loop
            self._held[1] -= on_loop
        self._wake.set()

    def _retitle(self, job: JobBase | None) -> None:
        with self._lock:
            free = self.capacity - self._running[0] - self._running[1]
            if free != self._free_shown:   # a gauge's write takes a lock and a file write
                self._free_shown = free
                metrics.WORKER_FREE_SLOTS.set(free)
        busy = self.capacity - free
        if self.on_title is not None:
            self.on_title(busy, self.capacity, job)

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for f in self._flights.values() if not f.abandoned)
