"""A worker that runs many jobs at once: ordinary handlers on threads,
``async def`` handlers on an event loop.

The thread that runs the worker claims; it is the only one that uses the
worker's own connection (claims, LISTEN).  Each claim takes as many jobs as
the worker has free slots (never more than ``batch``), so no claimed job
waits in this worker's hand while another worker could run it.  Every job
in flight has its own lease, tracked for the heartbeat manager, which
renews them all in one statement per round while the worker ticks.  A job
writes (``fenced()``, its error report, its release) on a connection
borrowed for that write alone: the threads share a pool of ``threads``
connections, the loop one of its own.  Jobs whose handlers wrote nothing
are completed together, fenced, by a completer thread, while the next claim
runs.  A worker whose handlers are all ``async def`` claims and completes on
its event loop instead (:mod:`pgfence.worker.onloop`), and its claiming
thread only starts those claims after an idle wait, and watches.

A handler that outlives its lease (its kind's ``timeout``, or a lease lost
otherwise) cannot be stopped from outside: a thread cannot be killed, and a
loop held by blocking code turns no more.  Its job is given up
``lost_lease_kill_after`` seconds later (released fenced: retried, or
failed when its attempts are spent) and, under ``pgfence run``, the worker
stops claiming, lets its other jobs finish, and exits to be replaced
(:data:`pgfence.prefork.child.RECYCLED`), so one stuck handler does not end
its neighbours' jobs.  An async job past its timeout is cancelled first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgfence import errortext, registry
from pgfence.asyncjob import AsyncJob
from pgfence.errors import DatabaseError, LeaseLost
from pgfence.job import Job, JobBase, RawJSON
from pgfence.observe import metrics
from pgfence.settings import Settings
from pgfence.store import db, pools
from pgfence.store import jobs as store
from pgfence.worker.aio import BLOCKED_AFTER, EventLoop
from pgfence.worker.lease import Lease
from pgfence.worker.onloop import EMPTY, LoopClaims
from pgfence.worker.loop import DEFERRED, DONE, LOST, LeaseTracker, Stats, Worker
from pgfence.worker.wake import Wake

log = logging.getLogger("pgfence.worker")

#: The interpreter's thread switch interval in a worker that runs many jobs.
SWITCH_INTERVAL = 0.001
#: Threads that write the error reports of async jobs (their writes are
#: synchronous, on the threads' pool).
REPORTERS = 2
#: Longest wait of the claiming thread between two looks at its jobs (their
#: timeouts, a blocked loop, a stop) while nothing wakes it.
TEND_EVERY = 0.1

#: Called with the jobs in flight, the capacity, and the job that just
#: started (None when one ended): the process title.
Title = Callable[[int, int, JobBase | None], None]


@dataclass(frozen=True)
class Claim:
    """One claim to try: up to ``size`` jobs, of ``kinds`` only (None: any)
    or of every kind but ``not_kinds``, for the loop's slots (``on_loop``)
    or the threads'."""

    size: int
    kinds: list[str] | None = None
    not_kinds: list[str] | None = None
    on_loop: bool = False


@dataclass(eq=False)
class Flight:
    """A job in flight."""

    job: JobBase
    is_async: bool
    task: asyncio.Task[Any] | None = None
    #: Cancelled at its timeout (async jobs).
    cancelled: bool = False
    #: The handler returned (async jobs; set on the loop's thread).
    returned: bool = False
    #: Given up: its handler outlived its lease by the grace period.
    abandoned: bool = False
    #: Seconds its handler ran (async jobs; observed with others).
    elapsed: float = 0.0


class ConcurrentWorker(Worker):
    """Runs up to ``threads`` ordinary jobs and ``async_concurrency`` async
    jobs at once.  ``recycle`` (under ``pgfence run``): give up and exit to
    be replaced once a handler outlives its lease by the grace period."""

    def __init__(self, dsn: str, settings: Settings, *, name: str | None = None,
                 heartbeat: LeaseTracker | None = None, on_title: Title | None = None,
                 recycle: bool = False) -> None:
        super().__init__(dsn, settings, name=name, heartbeat=heartbeat)
        self.with_async = registry.has_async()
        self.threads = settings.threads
        self.async_slots = settings.async_concurrency if self.with_async else 0
        self.capacity = self.threads + self.async_slots
        self.batch = settings.claim_size(self.with_async)
        #: The kinds the threads run and those the loop runs.
        self._kinds = ([s.kind for s in registry.specs() if not s.is_async],
                       [s.kind for s in registry.specs() if s.is_async])
        #: A worker whose handlers are all async claims and completes on its
        #: event loop (see onloop); one with def handlers too, here.
        self.claims_on_loop = self.with_async and not self._kinds[0]
        self._loop_claims: LoopClaims | None = None
        #: The job limit of this run (None: none), read by the loop's claims.
        self._max_jobs: int | None = None
        #: Notifications read while the loop claimed (see _claim_round_on_loop).
        self._notified = 0
        #: Async jobs that ended in this turn of the loop, and their outcomes.
        self._turn_ends: list[tuple[Flight, str]] = []
        self.recycle = recycle
        #: Why the worker stopped claiming to be replaced (None: it did not).
        self.recycle_reason: str | None = None
        self.on_title = on_title
        self._lock = threading.Lock()
        self._wake = Wake()
        self._flights: dict[tuple[int, int], Flight] = {}
        self._running = [0, 0]          # [threads, loop]
        self._deferred: list[JobBase] = []
        #: Deferred jobs of the threads and of the loop, waiting for the
        #: completer or in its statement: still tracked (their leases, their
        #: entries in the slot table), so still in their side's count until
        #: their completion has run.
        self._held = [0, 0]
        #: Set when a job ends without writing: the completer's cue.
        self._completions = threading.Event()
        self._completer_stop = threading.Event()
        self._completer: threading.Thread | None = None
        self._dispatched = 0
        self._finished = 0
        self._executor: ThreadPoolExecutor | None = None
        self._reporters: ThreadPoolExecutor | None = None
        self._loop: EventLoop | None = None
        self._apool: AsyncConnectionPool | None = None
        self._blocked_reported = False
        #: When the claiming thread last looked at the loop, and since when
        #: the loop's silence counts (see _watch_loop).
        self._watched_at: float | None = None
        self._watch_from = 0.0
        self._next_claim_at = 0.0
        #: The sides (threads, loop) whose last claim found nothing since the
        #: last wake-up (a NOTIFY, the idle wait's end): until then only the
        #: other side claims, as soon as it has room (see _idle_plan).
        self._dry = [False, False]

    # -- start and stop -----------------------------------------------------------

    def open(self) -> None:
        """The pools, the threads and the loop: after the fork, never before."""
        app = f"pgfence worker {self.name}"
        # A thread waiting for the GIL waits up to the switch interval (5 ms
        # by default) while another runs Python: with tens of threads, the
        # claiming thread, the completer and a job that ends would each lose
        # up to that much at every hand-over.
        sys.setswitchinterval(SWITCH_INTERVAL)
        grace = max(1.0, min(10.0, self.settings.lease / 3))
        # The threads, the reporters of async jobs' errors, the completer.
        self.pool = pools.open_threads_pool(self.dsn, size=self.threads + REPORTERS + 1, application_name=app,
                                            prepare=self.settings.prepare,
                                            idle_ms=self.settings.idle_in_transaction_ms, timeout=grace)
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="pgfence-job")
        self._completer = threading.Thread(target=self._complete_loop, name="pgfence-completer", daemon=True)
        self._completer.start()
        if self.with_async:
            self._reporters = ThreadPoolExecutor(REPORTERS, thread_name_prefix="pgfence-report")
            self._loop = EventLoop()
            self._loop.start()
            self._apool = self._loop.submit(pools.open_async_pool(
                self.dsn, size=self.async_slots, application_name=app, prepare=self.settings.prepare,
                idle_ms=self.settings.idle_in_transaction_ms, timeout=grace)).result()
            if self.claims_on_loop:
                self._loop_claims = LoopClaims(self, self._loop)
                self._loop.submit(self._loop_claims.start()).result()
        metrics.WORKER_CAPACITY.set(self.capacity)
        metrics.WORKER_FREE_SLOTS.set(self.capacity)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._reporters is not None:
            self._reporters.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            if self._apool is not None:
                # Closing: the process ends next, and the server ends the sessions.
                with contextlib.suppress(Exception):
                    self._loop.submit(self._apool.close(timeout=1.0)).result(timeout=3.0)
            self._loop.stop()
        if self.pool is not None:
            self.pool.close(timeout=1.0)
        metrics.WORKER_CAPACITY.set(0)
        metrics.WORKER_FREE_SLOTS.set(0)
        self._wake.close()
        super().close()

    # -- claims ----------------------------------------------------------------------

    def _make_job(self, row: store.Claimed, lease: Lease) -> Job:
        spec = registry.find(row.kind)
        if spec is not None and spec.is_async:
            # Typed as Job for the base class's claim(); dispatched by type.
            return AsyncJob(row.id, row.kind, row.queue, row.attempt, RawJSON(row.payload), lease,  # type: ignore[return-value]
                            row.max_attempts, row.dedupe_key, pool=self._apool, fence=self.settings.fence)
        return Job(row.id, row.kind, row.queue, row.attempt, RawJSON(row.payload), lease, row.max_attempts,
                   row.dedupe_key, pool=self.pool, fence=self.settings.fence)

    def free(self) -> tuple[int, int]:
        """Free slots of the threads and of the loop."""
        with self._lock:
            # A job whose handler returned frees its slot at once; its
            # lease (and its entry in the slot table, which has room for
            # twice the capacity) stays held until the completer's statement
            # that completes it has run.  Should completions fall behind by
            # more than the capacity, the claims wait for them.
            return (self.threads - self._running[0] - max(0, self._held[0] - self.threads),
                    self.async_slots - self._running[1] - max(0, self._held[1] - self.async_slots))

    def claim_plan(self) -> list[Claim]:
        """The claims to try, in turn, until one brings jobs: how many jobs
        each takes and of which kinds.  A worker with both threads and a
        loop claims for the side with the more free slots first, that
        side's kinds only (the threads take every kind but the loop's, so
        that an unknown kind is still put back), then for the other."""
        free_threads, free_loop = self.free()
        if not self.with_async:
            return [Claim(size) for size in (min(self.batch, free_threads),) if size > 0]
        sync_kinds, async_kinds = self._kinds
        if not sync_kinds:
            return [Claim(size) for size in (min(self.batch, free_loop),) if size > 0]
        loop = Claim(min(self.batch, free_loop), kinds=async_kinds, on_loop=True)
        threads = Claim(min(self.batch, free_threads), not_kinds=async_kinds)
        order = [loop, threads] if free_loop >= free_threads else [threads, loop]
        return [c for c in order if c.size > 0]

    # -- running ------------------------------------------------------------------------

    def loop_claim_size(self) -> int | None:
        """How many jobs the loop's next claim may take (see onloop): its
        free slots, at most ``batch`` and the jobs left to the run's limit;
        None when the worker claims no more (stopping, recycling, the limit
        reached, or a release still owed after an outage)."""
        if self.stopping or self.recycle_reason is not None or self._unreleased:
            return None
        size = min(self.batch, self.free()[1])
        if self._max_jobs is not None:
            left = self._max_jobs - self._dispatched
            if left <= 0:
                return None
            size = min(size, left)
        return size

    def dispatch_all(self, jobs: Sequence[JobBase], *, on_loop: bool = False) -> None:
        """Start a claim's jobs: the ordinary ones on the threads, the async
        ones as tasks of the loop, all created in one call on the loop's
        thread (``on_loop``: this is that thread)."""
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
        self._retitle(jobs[-1])
        tasks = [flight for flight in flights if flight.is_async]
        for flight in flights:
            if not flight.is_async:
                assert self._executor is not None
                self._executor.submit(self._run_threaded, flight)
        if tasks and on_loop:
            self._start_tasks(tasks)
        elif tasks:
            assert self._loop is not None
            self._loop.call(self._start_tasks, tasks)

    def _start_tasks(self, flights: list[Flight]) -> None:
        """On the loop's thread: a task for each async job."""
        loop = asyncio.get_running_loop()
        for flight in flights:
            task = loop.create_task(self._run_async(flight))
            task.add_done_callback(functools.partial(self._task_ended, flight))

    def _task_ended(self, flight: Flight, task: asyncio.Task[str]) -> None:
        """On the loop's thread: an async job ended.  What every job's end
        updates in the process (the in-flight gauge, the title, the
        duration histogram, the completed counter) is updated once for all
        the jobs that end in the same turn of the loop, in a callback that
        runs right after it."""
        outcome = _outcome(task)
        self._ended(flight, outcome)
        if not self._turn_ends:
            asyncio.get_running_loop().call_soon(self._after_turn)
        self._turn_ends.append((flight, outcome))

    def _after_turn(self) -> None:
        ended, self._turn_ends = self._turn_ends, []
        queues: dict[str, int] = {}
        durations: dict[tuple[str, str], list[float]] = {}
        completed: dict[tuple[str, str], int] = {}
        for flight, outcome in ended:
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
        if self._loop_claims is not None:
            self._loop_claims.freed()
        self._wake.set()

    def _run_threaded(self, flight: Flight) -> None:
        outcome = LOST
        try:
            outcome = self.run_job(flight.job, [])  # type: ignore[arg-type]
        finally:
            self._ended(flight, outcome)

    async def _run_async(self, flight: Flight) -> str:
        job = flight.job
        assert isinstance(job, AsyncJob)
        flight.task = asyncio.current_task()
        spec = registry.find(job.kind)
        started = time.monotonic()
        error: Exception | None = None
        outcome = DONE
        try:
            if spec is None:   # claimed with the loop's kinds: cannot happen
                raise RuntimeError(f"no handler for kind {job.kind!r}")
            self._start(job)
            await spec.func(job)   # type: ignore[misc]
            flight.returned = True
            if flight.cancelled and not job.completed:
                # Still running at its timeout, so cancelled, but the cancel
                # never reached it: it held the loop (blocking code) until
                # it returned.  Timed out all the same, not completed.
                raise LeaseLost(job.id, job.attempt, "timeout")
            if not job.completed:
                if job.fence:
                    outcome = DEFERRED
                else:
                    async with job.fenced():
                        pass
        except asyncio.CancelledError:
            if not flight.cancelled:
                raise
            error = LeaseLost(job.id, job.attempt, "timeout")
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            error = exc
        flight.elapsed = time.monotonic() - started
        if error is not None and flight.abandoned:
            # Given up already (released, retried or failed): nothing to report.
            return LOST
        if error is not None:
            # The report is a synchronous write: on a reporting thread, so
            # that the loop goes on with the other jobs.
            assert self._reporters is not None
            outcome = await asyncio.get_running_loop().run_in_executor(self._reporters, self._after_error,
                                                                      job, error)
        return outcome

    def _ended(self, flight: Flight, outcome: str) -> None:
        """A job's handler returned (on its thread, or on the loop, where
        _after_turn does the rest)."""
        job = flight.job
        if flight.is_async:
            if outcome != DEFERRED and self.heartbeat is not None:
                self.heartbeat.untrack(job.lease)
            if outcome != DEFERRED:
                self.stats.add(outcome)
        with self._lock:
            self._flights.pop((job.id, job.attempt), None)
            self._running[flight.is_async] -= 1
            self._finished += 1
            if outcome == DEFERRED and not flight.abandoned:
                self._held[flight.is_async] += 1
                if flight.is_async and self._loop_claims is not None:
                    self._loop_claims.defer(job)   # type: ignore[arg-type]
                else:
                    self._deferred.append(job)
                    self._completions.set()
        if flight.is_async:
            return
        metrics.of(metrics.JOBS_IN_FLIGHT, job.queue).dec()
        self._retitle(None)
        self._wake.set()

    def completed_on_loop(self, count: int) -> None:
        """On the loop's thread: ``count`` deferred async jobs were completed
        (or given up) and untracked."""
        with self._lock:
            self._held[1] -= count
        if self._loop_claims is not None:
            self._loop_claims.freed()
        self._wake.set()

    def _retitle(self, job: JobBase | None) -> None:
        with self._lock:
            busy = self._running[0] + self._running[1]
        metrics.WORKER_FREE_SLOTS.set(self.capacity - busy)
        if self.on_title is not None:
            self.on_title(busy, self.capacity, job)

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for f in self._flights.values() if not f.abandoned)

    # -- the claiming thread's rounds -------------------------------------------------------

    def _flush(self) -> None:
        """Complete, in one fenced statement, the jobs that ended without
        writing."""
        with self._lock:
            done, self._deferred = self._deferred, []
        if not done:
            return
        # Counted first: complete_deferred empties the list.
        on_loop = sum(isinstance(job, AsyncJob) for job in done)
        on_threads = len(done) - on_loop
        try:
            self.complete_deferred(done)  # type: ignore[arg-type]
        finally:
            # Completed or not, their leases are untracked now.
            with self._lock:
                self._held[0] -= on_threads
                self._held[1] -= on_loop
            self._wake.set()

    def _complete_loop(self) -> None:
        """The completer thread: completes the jobs that ended without
        writing as soon as there are any, on a connection of the pool, while
        the claiming thread claims on its own."""
        while not self._completer_stop.is_set():
            self._completions.wait(TEND_EVERY)
            self._completions.clear()
            try:
                self._flush()
            except Exception as exc:  # noqa: BLE001 - never let the completer die: the leases bring the jobs back
                log.error("batched completion failed: %s: %s", type(exc).__name__, db.first_line(exc))

    @contextlib.contextmanager
    def _completion_conn(self) -> Iterator[psycopg.Connection]:
        assert self.pool is not None
        with db.translated(self.dsn), pools.connection(self.pool) as conn:
            yield conn

    def _tend(self) -> None:
        """Between claims: cancel async jobs past their timeout, give up
        handlers that outlive their lease by the grace period, report a
        blocked loop."""
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
                assert self._loop is not None
                self._loop.call(_cancel, flight)
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
        elif self.heartbeat is not None:
            self.heartbeat.untrack(job.lease)
        if self.heartbeat is not None:
            self.heartbeat.untrack(job.lease)
        if self.recycle and self.recycle_reason is None:
            self.recycle_reason = "timeout" if reason == "timeout" else "lost_lease"

    def _watch_loop(self, now: float) -> None:
        if self._loop is None:
            return
        previous, self._watched_at = self._watched_at, now
        if previous is not None and now - previous > BLOCKED_AFTER:
            # This thread did not look for that long either: the whole
            # process stood still (SIGSTOP, a suspended machine) or this
            # thread waited on the database.  The loop was not seen blocked
            # meanwhile, and after a resume this thread may look before the
            # loop's first turn (which runs the timers that fell due while
            # stopped): its silence counts from now.
            self._watch_from = now
        silent = self._loop.silent_for(now, since=self._watch_from)
        if silent <= BLOCKED_AFTER:
            self._blocked_reported = False
            return
        if self._blocked_reported:
            return
        self._blocked_reported = True
        task = self._loop.running_task()
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

    def _wait_for_slot(self) -> None:
        """Every slot taken: wait for a job to end (or a look at the jobs)."""
        self._wake.wait(TEND_EVERY)
        self._wake.clear()

    def _wait(self, seconds: float) -> None:
        """Nothing to claim: wait for an enqueue's NOTIFY or a job's end, at
        most ``seconds`` (a job's end frees a slot that a side with jobs
        queued claims for at once: see _idle_plan)."""
        if not self._listening or self._conn is None or self._conn.closed:
            self._wake.wait(seconds)
            self._wake.clear()
            return
        try:
            notes = list(self._conn.notifies(timeout=0))
            if not notes:
                self._wake.wait_along(self._conn.fileno(), seconds)
                self._wake.clear()
                notes = list(self._conn.notifies(timeout=0))
            woken = self._woken(notes)
        except (psycopg.Error, OSError):
            self._drop_connection()
            return
        if woken:
            self._drain_notifies()
            self._next_claim_at = 0.0

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
        self._max_jobs = max_jobs
        try:
            self.open()
            next_tend = 0.0
            while True:
                now = time.monotonic()
                if now >= next_tend:
                    # Not at every turn: a busy worker turns once per job
                    # that ends, and a look is one lease check per job.
                    self._tend()
                    next_tend = now + TEND_EVERY / 2
                if self.stopping or self.recycle_reason is not None:
                    # The loop's claims stop first: a claim under way there
                    # starts its jobs, which are then in flight.
                    if self._loop_claims is not None and not self._loop_claims.halt(TEND_EVERY):
                        continue
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
                if self._loop_claims is not None:
                    if self._claim_round_on_loop(burst):
                        break
                    continue
                plan = self.claim_plan()
                if max_jobs is not None:
                    # Never claim past the job limit: the jobs over it would
                    # run in a child that should already be replaced.
                    left = max_jobs - self._dispatched
                    plan = [Claim(min(c.size, left), c.kinds, c.not_kinds, c.on_loop) for c in plan if left > 0]
                if not plan:
                    self._wait_for_slot()
                    continue
                plan = self._idle_plan(plan)
                if not plan:
                    self._wait(TEND_EVERY / 2)
                    continue
                jobs = []
                try:
                    self._release_unreleased()
                    for claim in plan:
                        jobs = self.claim(claim.size, claim.kinds, claim.not_kinds)
                        if jobs:
                            break
                        self._dry[claim.on_loop] = True
                except DatabaseError as exc:
                    log.warning("%s", exc)
                    self._forget_connection(exc)
                    self._stop.wait(self.settings.poll_interval)
                    continue
                if jobs:
                    notified = self.notes_before_claim + self._drain_notifies()
                    if notified and time.monotonic() < self._next_claim_at:
                        # An enqueue while idle: the dry side may have a job now.
                        self._next_claim_at = 0.0
                    self.dispatch_all(jobs)
                    continue
                self._maybe_prune()
                if burst:
                    if self.in_flight() == 0:
                        break
                    self._wait_for_slot()
                    continue
                self._next_claim_at = time.monotonic() + self.idle_wait()
        finally:
            self._completer_stop.set()
            self._completions.set()
            if self._completer is not None:
                self._completer.join(timeout=self.settings.graceful_timeout)
            self._flush_safely()
            self.close()
        return self.stats

    def _idle_plan(self, plan: list[Claim]) -> list[Claim]:
        """The claims to try now.  Once a claim round found nothing, the
        worker idles until a NOTIFY or the idle wait's end; but a side that
        was full then was not looked at, and its queued jobs would wait that
        long for its freed slots: its claims go on, the dry side's wait."""
        if time.monotonic() >= self._next_claim_at:
            self._dry = [False, False]
            return plan
        return [claim for claim in plan if not self._dry[claim.on_loop]]

    def _flush_safely(self) -> None:
        try:
            self._flush()
        except Exception as exc:  # noqa: BLE001 - stopping: the leases run out and the jobs are reclaimed
            log.warning("could not complete the last jobs: %s", db.first_line(exc))
        if self._loop_claims is None or self._loop is None:
            return
        wait = self.settings.graceful_timeout
        try:
            # A loop still blocked by a handler answers neither: its jobs
            # are released when this process has exited.
            if self._loop_claims.halt(wait):
                self._loop.submit(self._loop_claims.close(wait)).result(wait + 1.0)
        except Exception as exc:  # noqa: BLE001 - as above; a loop still blocked ends with the process
            log.warning("could not complete the last jobs of the event loop: %s: %s", type(exc).__name__,
                        db.first_line(exc))

    def _claim_round_on_loop(self, burst: bool) -> bool:
        """One round of this thread while the event loop claims for itself
        (see onloop); True when a burst is over."""
        claims = self._loop_claims
        assert claims is not None
        if not claims.parked.wait(TEND_EVERY / 2):
            # Read, or psycopg would keep every notification while the loop
            # claims; counted, since one read during a claim that then finds
            # nothing may come from an enqueue that claim did not see.
            self._notified += self._drain_notifies()
            # A loop that never runs dry never parks: a pause must reach its
            # claims all the same.
            try:
                self.refresh_pauses()
            except DatabaseError as exc:
                log.warning("%s", exc)
                self._forget_connection(exc)
            return False
        outcome, claims.outcome = claims.outcome, None
        if isinstance(outcome, DatabaseError):
            log.warning("%s", outcome)
            self._stop.wait(self.settings.poll_interval)
            return False
        if outcome == EMPTY and self._notified:
            self._next_claim_at = 0.0        # one more claim, which sees those enqueues
        elif outcome == EMPTY:
            self._maybe_prune()
            if burst:
                if self.in_flight() == 0:
                    return True
                self._wait_for_slot()
                return False
            self._next_claim_at = time.monotonic() + self.idle_wait()
        if time.monotonic() < self._next_claim_at:
            self._wait(TEND_EVERY / 2)
            return False
        try:
            self._release_unreleased()
            self._drain_notifies()
            # The loop's claims read self.paused: kept fresh from here.
            self.refresh_pauses()
        except DatabaseError as exc:
            log.warning("%s", exc)
            self._forget_connection(exc)
            self._stop.wait(self.settings.poll_interval)
            return False
        self._notified = 0
        claims.resume()
        return False

    def _wait_for_work(self) -> None:   # the base class's idle wait: not used here
        self._wait(TEND_EVERY)


def _cancel(flight: Flight) -> None:
    """On the loop's thread: cancel an async job's task, unless its handler
    returned meanwhile (a loop held by blocking code runs this only once the
    handler lets go; the cancel would then hit the job's error report)."""
    if flight.task is not None and not flight.returned:
        flight.task.cancel()


def _outcome(future: Future[str] | asyncio.Future[str]) -> str:
    """A loop job's outcome; one that raised (a bug here, or a cancel at
    shutdown) lost its job, which its lease brings back."""
    try:
        return future.result()
    except BaseException as exc:  # noqa: BLE001
        log.error("async job runner failed: %s: %s", type(exc).__name__, db.first_line(exc))
        return LOST


def make_worker(dsn: str, settings: Settings, *, name: str | None = None, heartbeat: LeaseTracker | None = None,
                on_job: Callable[[Job | None], None] | None = None, on_title: Title | None = None,
                recycle: bool = False) -> Worker:
    """The worker for ``settings`` and the handlers loaded: one job at a
    time (one thread, no async handler) or many."""
    if settings.threads > 1 or registry.has_async():
        return ConcurrentWorker(dsn, settings, name=name, heartbeat=heartbeat, on_title=on_title, recycle=recycle)
    return Worker(dsn, settings, name=name, heartbeat=heartbeat, on_job=on_job)
