"""The worker engine: one pipeline for every mode.

claim (sized to free slots, expired leases reclaimed) -> dispatch to a slot
-> run -> complete (fenced; batched where the job wrote nothing) -> release
on death or drain.  The modes (one job at a time, threads, an event loop, or
threads and a loop for a module with both ``def`` and ``async def``
handlers) differ only in their slots (:mod:`pgfence.worker.slots`); how
jobs are claimed and woken for (:mod:`~pgfence.worker.claiming`), ended
(:mod:`~pgfence.worker.outcomes`), completed
(:mod:`~pgfence.worker.completion`) and watched for timeouts, lost leases
and a blocked loop (:mod:`~pgfence.worker.watch`) is this one engine's.

The thread that runs the engine claims; it is the only one that uses the
worker's own connection (claims, LISTEN).  Each claim takes as many jobs as
the worker has free slots (never more than ``batch``), so no claimed job
waits in this worker's hand while another worker could run it.  Every job
in flight has its own lease, tracked for the heartbeat manager.  One worker
is one process: under ``pgfence run`` a forked child, under ``pgfence work``
the process itself, with its heartbeat manager in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
from psycopg_pool import ConnectionPool

from pgfence import identity, registry
from pgfence.asyncjob import AsyncJob
from pgfence.backoff import Backoff
from pgfence.errors import DatabaseError
from pgfence.job import Job, JobBase, RawJSON
from pgfence.observe import metrics
from pgfence.renewal.renewer import HeartbeatManager, validate_heartbeat
from pgfence.settings import Settings
from pgfence.store import jobs as store
from pgfence.store import pools
from pgfence.worker.claiming import Claim, Claiming
from pgfence.worker.completion import Completer, Completing, on_pool
from pgfence.worker.lease import Lease, LeaseTracker
from pgfence.worker.outcomes import Stats
from pgfence.worker.slots import REPORTERS, Flight, InlineSlot, LoopSlots, Slots, ThreadSlots
from pgfence.worker.wake import Wake
from pgfence.worker.flights import InFlight, Title
from pgfence.worker.watch import Watching

log = logging.getLogger("pgfence.worker")

#: The interpreter's thread switch interval in a worker that runs many jobs.
SWITCH_INTERVAL = 0.001
LOOP_CLAIM_SHARE = 32   #: a loop with jobs running claims once this share of its slots is free
#: Longest wait of the claiming thread between two looks at its jobs (their
#: timeouts, a blocked loop, a stop) while nothing wakes it.
TEND_EVERY = 0.1


def default_name() -> str:
    """``host:pid:instance`` (see :mod:`pgfence.identity`)."""
    return identity.process_name()


class Engine(InFlight, Watching, Claiming, Completing):
    """Claims and runs jobs from ``settings.queues`` in the slots the
    handlers loaded need (see :mod:`pgfence.worker.slots`).

    ``heartbeat`` is the manager that renews this worker's leases; when None
    the worker starts its own in a thread.  ``on_title`` (if given) is called
    as each job starts and ends (the process title).  ``recycle`` (under
    ``pgfence run``): give up and exit to be replaced once a handler outlives
    its lease by the grace period."""

    def __init__(self, dsn: str, settings: Settings, *, name: str | None = None,
                 heartbeat: LeaseTracker | None = None, on_title: Title | None = None,
                 recycle: bool = False) -> None:
        self.dsn = dsn
        self.settings = settings
        self.name = name or default_name()
        self.stats = Stats()
        #: The retry backoff of every failed attempt of this worker's jobs,
        #: also those its own heartbeat manager reports.
        self.retry_backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self._stop = threading.Event()
        self._wake = Wake()
        self._conn: psycopg.Connection | None = None
        self._listening = False
        #: The manager this worker started itself (in a thread), if any.
        self._own: HeartbeatManager | None = None
        self.heartbeat = heartbeat
        if heartbeat is None and settings.renew:
            validate_heartbeat(settings.heartbeat, registry.specs())
            self.heartbeat = self._own = HeartbeatManager(
                dsn, default_lease=settings.lease, interval=settings.heartbeat,
                timeout_grace=settings.lost_lease_kill_after, prepare=settings.prepare, backoff=self.retry_backoff,
                idle_in_transaction_timeout=settings.idle_in_transaction_timeout)
        self._last_prune = time.monotonic()
        self._owner = threading.current_thread()
        self._next_reclaim_scan = 0.0
        self._durations, self._unknown_logged, self._unreleased, self._unrecorded = None, set(), [], []
        self.pool: ConnectionPool | None = None   #: the threads' pool (None: the one slot's connection)
        self.paused = frozenset()
        self.notes_before_claim = 0
        self._pauses_stale, self._pauses_read_at = True, 0.0
        self.with_async = registry.has_async()
        self._kinds = ([s.kind for s in registry.specs() if not s.is_async],
                       [s.kind for s in registry.specs() if s.is_async])
        self.threads = settings.threads
        self.async_slots = settings.async_concurrency if self.with_async else 0
        self.capacity = self.threads + self.async_slots
        self.claim_size = self.batch = settings.claim_size(self.with_async)
        self.loop_claim_min = max(1, min(self.batch, self.async_slots // LOOP_CLAIM_SHARE))
        #: One job at a time on the claiming thread: one thread, no async handler.
        self.inline = settings.threads == 1 and not self.with_async
        #: The slots of def handlers (the one slot or the threads; in a module
        #: of async handlers alone, they run the jobs of kinds nobody here
        #: knows, which are put back) and those of async def handlers.
        self.sync_slots: InlineSlot | ThreadSlots = InlineSlot(self) if self.inline else ThreadSlots(self, self.threads)
        self.loop_slots = LoopSlots(self, self.async_slots, self.name) if self.with_async else None
        self.completer: Completer | None = None
        self.recycle = recycle
        #: Why the worker stopped claiming to be replaced (None: it did not).
        self.recycle_reason: str | None = None
        self.on_title = on_title
        self._lock = threading.Lock()
        self._flights: dict[tuple[int, int], Flight] = {}
        self._running = [0, 0]          # [threads or the one slot, loop]
        self._free_shown = self.capacity
        #: Deferred jobs of each side waiting for the completer or in its
        #: statement: still tracked, so still in their side's count.
        self._held = [0, 0]
        self._dispatched = self._finished = 0
        self._watched_at: float | None = None
        self._watch_from = 0.0
        self._blocked_reported = False
        self._next_claim_at = 0.0
        #: The sides whose last claim found nothing since the last wake-up:
        #: until then only the other side claims (see _idle_plan).
        self._dry = [False, False]
        self._opened = False

    # -- start and stop -------------------------------------------------------------

    @property
    def slots(self) -> list[Slots]:
        return [self.sync_slots] if self.loop_slots is None else [self.sync_slots, self.loop_slots]

    def open(self) -> None:
        """The pools, threads and loop of the slots: after the fork, never before."""
        if self._opened:
            return
        self._opened = True
        if not self.inline:
            # A thread waiting for the GIL waits up to the switch interval (5
            # ms by default) while another runs Python: with many threads,
            # the claiming thread, the completer and a job that ends would
            # each lose up to that much at every hand-over.
            sys.setswitchinterval(SWITCH_INTERVAL)
            grace = max(1.0, min(10.0, self.settings.lease / 3))
            # The threads, the reporters of async jobs' errors, the completer.
            self.pool = pools.open_threads_pool(
                self.dsn, size=self.threads + REPORTERS + 1, application_name=f"pgfence worker {self.name}",
                prepare=self.settings.prepare, idle_ms=self.settings.idle_in_transaction_ms, timeout=grace)
            self.completer = Completer(self.complete_deferred, self._settled, TEND_EVERY)
            self.completer.start()
        for slots in self.slots:
            slots.open()
        metrics.WORKER_CAPACITY.set(self.capacity)
        metrics.WORKER_FREE_SLOTS.set(self._free_shown)

    def close(self) -> None:
        for slots in self.slots:
            slots.close()
        if self.pool is not None:
            self.pool.close(timeout=1.0)
            self.pool = None
        metrics.WORKER_CAPACITY.set(0)
        metrics.WORKER_FREE_SLOTS.set(0)
        self._wake.close()
        if self._own is not None:
            self._own.stop()
        self._drop_connection()

    def request_stop(self) -> None:
        """Stop claiming; the jobs running now are finished first."""
        self._stop.set()

    # -- jobs -------------------------------------------------------------------------

    def _make_job(self, row: store.Claimed, lease: Lease) -> JobBase:
        spec = registry.find(row.kind)
        if spec is not None and spec.is_async:
            return AsyncJob(row.id, row.kind, row.queue, row.attempt, RawJSON(row.payload), lease,
                            row.max_attempts, row.dedupe_key,
                            pool=self.loop_slots.pool if self.loop_slots is not None else None,
                            fence=self.settings.fence)
        on = {"conn": self.conn} if self.inline else {"pool": self.pool}
        return Job(row.id, row.kind, row.queue, row.attempt, RawJSON(row.payload), lease, row.max_attempts,
                   row.dedupe_key, fence=self.settings.fence, **on)

    @contextlib.contextmanager
    def _conn_for(self, job: JobBase) -> Iterator[psycopg.Connection]:
        """The connection a write about ``job`` (its error report, its
        release, its put-back) goes on: the worker's own for the one slot on
        the claiming thread, else one of the threads' pool's for this write."""
        if self.pool is not None:
            with on_pool(self.pool, self.dsn) as conn:
                yield conn
            return
        yield self.conn

    def _completion_conn(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        if self.pool is not None:
            return on_pool(self.pool, self.dsn)
        return contextlib.nullcontext(self.conn)

    def free(self) -> tuple[int, int]:
        """Free slots of the threads (or the one slot) and of the loop."""
        with self._lock:
            # A job whose handler returned frees its slot at once; its lease
            # (and its entry in the slot table, which has room for twice the
            # capacity) stays held until the completer's statement has run.
            # Should completions fall behind by more than the capacity, the claims wait.
            if self.inline:
                sync = 0 if self._running[0] else self.claim_size
            else:
                sync = self.threads - self._running[0] - max(0, self._held[0] - self.threads)
            loop = self.async_slots - self._running[1] - max(0, self._held[1] - self.async_slots)
            # A nearly full loop claims a few at a time, not once per job
            # that ends: each claim scans past the rows completed since the last vacuum.
            return (sync, loop if loop >= self.loop_claim_min or not self._running[1] else 0)

    def claim_plan(self) -> list[Claim]:
        """The claims to try, in turn, until one brings jobs: how many jobs
        each takes and of which kinds.  A worker with slots of both sorts
        claims for the side with the more free slots first, that side's
        kinds only (the threads take every kind but the loop's, so that an
        unknown kind is still put back), then for the other."""
        free_sync, free_loop = self.free()
        if self.loop_slots is None:
            return [Claim(size) for size in (min(self.batch, free_sync),) if size > 0]
        sync_kinds, async_kinds = self._kinds
        if not sync_kinds:
            return [Claim(size) for size in (min(self.batch, free_loop),) if size > 0]
        loop = Claim(min(self.batch, free_loop), kinds=async_kinds, on_loop=True)
        sync = Claim(min(self.batch, free_sync), not_kinds=async_kinds)
        order = [loop, sync] if free_loop >= free_sync else [sync, loop]
        return [c for c in order if c.size > 0]

    def run_job(self, job: Job, deferred: list[Job] | None = None) -> str:
        if self.inline:
            self._retitle(job)   # the one slot's title names the job it runs
        return super().run_job(job, deferred)

    # -- the claiming thread's rounds ---------------------------------------------------

    def run_once(self) -> int:
        """One round of claims into free slots, its jobs dispatched (for the
        one slot: run and completed); returns how many jobs were claimed."""
        self.open()
        self._release_unreleased()
        jobs = self.claim_round()
        self.dispatch_all(jobs)
        return len(jobs)

    def claim_round(self, plan: list[Claim] | None = None) -> list[JobBase]:
        """Try the plan's claims in turn until one brings jobs.  Whether they
        look for expired leases is decided once for the round, so each slot
        kind's claim scans its own kinds' expired leases.  The jobs are
        claimed, not dispatched."""
        if plan is None:
            plan = self.claim_plan()
        reclaim = self.reclaim_due()
        for index, claim in enumerate(plan):
            jobs = self.claim(claim.size, claim.kinds, claim.not_kinds, reclaim=reclaim)
            for earlier in plan[:index] if self.notes_before_claim else ():
                self._dry[earlier.on_loop] = False   # an enqueue read after their claims: not dry
            if jobs:
                if reclaim and index + 1 < len(plan):
                    # The other side's claim, not sent, owes its reclaim scan.
                    self._next_reclaim_scan = 0.0
                return jobs
            self._dry[claim.on_loop] = True
        return []

    def run(self, *, burst: bool = False, max_jobs: int | None = None,
            enough: Callable[[], bool] | None = None) -> Stats:
        """Claim into free slots until asked to stop (or, with ``burst``,
        until the queues are empty; or until ``max_jobs`` jobs were started,
        or ``enough()`` is true after a job ended, or a handler outlived its
        lease under ``recycle``), then let the jobs in flight end."""
        self._owner = threading.current_thread()
        if self._own is not None:
            self._own.start()
        checked = 0
        try:
            self.open()
            next_tend = 0.0
            while True:
                now = time.monotonic()
                if now >= next_tend:
                    # Not at every turn: a busy worker turns once per job
                    # that ends, and a look is one lease check per job.
                    self.tend()
                    next_tend = now + TEND_EVERY / 2
                if self.stopping or self.recycle_reason is not None:
                    if self.in_flight() == 0:
                        break
                    self._wake.wait(TEND_EVERY)
                    self._wake.clear()
                    continue
                if max_jobs is not None and self._dispatched >= max_jobs:
                    self.recycle_reason = "max_jobs"
                    continue
                if enough is not None and self._finished > checked:
                    checked = self._finished
                    if enough():
                        self.recycle_reason = "max_memory"
                        continue
                if self._round(burst, max_jobs):
                    break
        finally:
            if self.completer is not None:
                self.completer.stop(self.settings.graceful_timeout)
            self.record_unrecorded()
            self.close()
        return self.stats

    def _round(self, burst: bool, max_jobs: int | None) -> bool:
        """One turn of the claiming thread; True when a burst is over."""
        plan = self.claim_plan()
        if max_jobs is not None:
            # Never claim past the job limit: the jobs over it would run in
            # a child that should already be replaced.
            left = max_jobs - self._dispatched
            plan = [Claim(min(c.size, left), c.kinds, c.not_kinds, c.on_loop) for c in plan if left > 0]
        if not plan:
            self._wake.wait(TEND_EVERY)
            self._wake.clear()
            return False
        plan = self._idle_plan(plan)
        if not plan:
            if self.wait_for_work(TEND_EVERY / 2):
                self._next_claim_at = 0.0
            return False
        try:
            self._release_unreleased()
            jobs = self.claim_round(plan)
        except DatabaseError as exc:
            # Unreachable, or a claim refused (a statement timeout, a
            # conflict): wait, then claim again.
            log.warning("%s", exc)
            self._forget_connection(exc)
            self._stop.wait(self.settings.poll_interval)
            return False
        if jobs:
            # Only while a dry side waits does a notification matter here
            # (an enqueue: the dry side may have a job now); otherwise the
            # next claim reads it, and each read is a poll of the socket.
            if time.monotonic() < self._next_claim_at and self.notes_before_claim + self._drain_notifies():
                self._next_claim_at = 0.0
            self.dispatch_all(jobs)
            return False
        self._maybe_prune()
        if burst:
            if self.in_flight() == 0:
                return True
            self._wake.wait(TEND_EVERY)
            self._wake.clear()
            return False
        self._next_claim_at = time.monotonic() + self.idle_wait()
        return False

    def _idle_plan(self, plan: list[Claim]) -> list[Claim]:
        """The claims to try now.  Once a claim round found nothing, the
        worker idles until a NOTIFY, a job's end or the idle wait's end; but
        a side that was full then was not looked at, and its queued jobs
        would wait that long for its freed slots: its claims go on, the dry
        side's wait."""
        if time.monotonic() >= self._next_claim_at:
            self._dry = [False, False]
            return plan
        return [claim for claim in plan if not self._dry[claim.on_loop]]


#: The names 0.2 gave the engine: one job at a time, and many.
Worker = ConcurrentWorker = Engine


def make_worker(dsn: str, settings: Settings, *, name: str | None = None, heartbeat: LeaseTracker | None = None,
                on_title: Title | None = None, recycle: bool = False) -> Engine:
    """The worker for ``settings`` and the handlers loaded."""
    return Engine(dsn, settings, name=name, heartbeat=heartbeat, on_title=on_title, recycle=recycle)
