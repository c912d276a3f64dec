"""The slots a worker runs its handlers in: the only part of the engine that
differs between its modes.

A slot kind takes the jobs of one claim (:meth:`Slots.start`) and runs each
handler to its end, telling the engine of every end (:meth:`Host.ended`).
Everything else (the claim and its size, the idle wait, reclaims, leases,
completion, timeouts, recycling, the drain) is the engine's, the same for
every kind:

- :class:`InlineSlot`: one job at a time, on the claiming thread, writing on
  the worker's own connection (``--threads 1`` and only ``def`` handlers);
- :class:`ThreadSlots`: ``def`` handlers on ``threads`` threads, writing on a
  pool shared by the threads;
- :class:`LoopSlots`: ``async def`` handlers as tasks of an event loop in a
  thread of its own, writing on a pool of the loop.

A worker whose module has both ``def`` and ``async def`` handlers has
threads and a loop (or the one slot and a loop), and claims for each kind's
free slots that kind's jobs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from pgfence import registry, results
from pgfence.asyncjob import AsyncJob
from pgfence.errors import LeaseLost, PgfenceError
from pgfence.job import Job, JobBase
from pgfence.observe import metrics
from pgfence.settings import Settings
from pgfence.store import db, pools
from pgfence.worker.aio import EventLoop
from pgfence.worker.completion import DEFER_MAX
from pgfence.worker.outcomes import DEFERRED, DONE, LOST, RELEASED

log = logging.getLogger("pgfence.worker")

#: Threads that write the error reports of async jobs (their writes are
#: synchronous, on the threads' pool).
REPORTERS = 2


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


class Host(Protocol):
    """What a slot kind asks of the engine."""

    settings: Settings
    dsn: str
    _durations: dict[tuple[str, str], list[float]] | None

    @property
    def stopping(self) -> bool: ...

    def run_job(self, job: Job, deferred: list[Job] | None = None) -> str: ...

    def _start(self, job: JobBase) -> None: ...

    def _after_error(self, job: JobBase, exc: Exception) -> str: ...

    def release(self, job: JobBase, *, reclaim: bool = False, reason: str | None = None,
                retry_later: bool = False, detail: str | None = None) -> bool: ...

    def complete_deferred(self, jobs: list[JobBase]) -> int: ...

    def ended(self, flight: Flight, outcome: str, *, counted: bool = True) -> None: ...

    def ended_together(self, ended: list[tuple[Flight, str]]) -> None: ...

    def record(self, outcome: str) -> None: ...

    def _retitle(self, job: JobBase | None) -> None: ...


class Slots(Protocol):
    """A slot kind (see the module's docstring)."""

    #: True for the event loop's slots (the claims for them take its kinds).
    on_loop: bool
    capacity: int

    def open(self) -> None: ...

    def start(self, flights: Sequence[Flight]) -> None: ...

    def close(self) -> None: ...


class InlineSlot:
    """One job at a time, on the claiming thread: :meth:`start` returns once
    the claim's jobs have run.  Jobs that wrote nothing are completed
    together at the end of the claim's batch or, between its jobs, once the
    oldest has waited ``DEFER_MAX`` seconds; their leases stay held (and
    renewed) until then, so the wait costs latency, never safety."""

    on_loop = False
    capacity = 1

    def __init__(self, host: Host) -> None:
        self.host = host

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def start(self, flights: Sequence[Flight]) -> None:
        host = self.host
        deferred: list[Job] = []
        oldest = 0.0
        host._durations = {}
        try:
            for index, flight in enumerate(flights):
                # Asked to stop: the job in hand runs, the rest go back.
                if host.stopping and index > 0:
                    for rest in flights[index:]:
                        released = host.release(rest.job, detail="released at shutdown before it started")
                        host.ended(rest, RELEASED if released else LOST, counted=released)
                    break
                outcome = LOST
                try:
                    outcome = host.run_job(flight.job, deferred)  # type: ignore[arg-type]
                finally:
                    host.ended(flight, outcome, counted=False)
                if outcome == DEFERRED and len(deferred) == 1:
                    oldest = time.monotonic()
                if deferred and time.monotonic() - oldest >= DEFER_MAX:
                    host.complete_deferred(deferred)  # type: ignore[arg-type]
        finally:
            try:
                host.complete_deferred(deferred)  # type: ignore[arg-type]
            finally:
                host._retitle(None)
                durations, host._durations = host._durations, None
                for (queue, kind), values in (durations or {}).items():
                    metrics.observe_many(metrics.of(metrics.JOB_DURATION, queue, kind), values)


class ThreadSlots:
    """``def`` handlers on ``threads`` threads."""

    on_loop = False

    def __init__(self, host: Host, threads: int) -> None:
        self.host = host
        self.capacity = threads
        self._executor: ThreadPoolExecutor | None = None

    def open(self) -> None:
        self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix="pgfence-job")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def start(self, flights: Sequence[Flight]) -> None:
        assert self._executor is not None
        for flight in flights:
            self._executor.submit(self._run, flight)

    def _run(self, flight: Flight) -> None:
        outcome = LOST
        try:
            outcome = self.host.run_job(flight.job, [])  # type: ignore[arg-type]
        finally:
            self.host.ended(flight, outcome, counted=False)


class LoopSlots:
    """``async def`` handlers as tasks of an event loop of their own.  What
    every job's end updates in the process (the in-flight gauge, the title,
    the duration histogram) is updated once for all the jobs that end in
    the same turn of the loop."""

    on_loop = True

    def __init__(self, host: Host, concurrency: int, name: str) -> None:
        self.host = host
        self.capacity = concurrency
        self.name = name
        self.loop: EventLoop | None = None
        self.pool: AsyncConnectionPool | None = None
        self._reporters: ThreadPoolExecutor | None = None
        self._turn_ends: list[tuple[Flight, str]] = []

    def open(self) -> None:
        settings = self.host.settings
        grace = max(1.0, min(10.0, settings.lease / 3))
        self._reporters = ThreadPoolExecutor(REPORTERS, thread_name_prefix="pgfence-report")
        self.loop = EventLoop()
        self.loop.start()
        self.pool = self.loop.submit(pools.open_async_pool(
            self.host.dsn, size=self.capacity, application_name=f"pgfence worker {self.name}",
            prepare=settings.prepare, idle_ms=settings.idle_in_transaction_ms, timeout=grace)).result()

    def close(self) -> None:
        if self._reporters is not None:
            self._reporters.shutdown(wait=False, cancel_futures=True)
        if self.loop is not None:
            if self.pool is not None:
                # Closing: the process ends next, and the server ends the sessions.
                try:
                    self.loop.submit(self.pool.close(timeout=1.0)).result(timeout=3.0)
                except Exception as exc:  # noqa: BLE001 - closing anyway
                    log.debug("closing the event loop's pool: %s", db.first_line(exc))
            self.loop.stop()

    def start(self, flights: Sequence[Flight]) -> None:
        assert self.loop is not None
        self.loop.call(self._start_tasks, list(flights))

    def cancel(self, flight: Flight) -> None:
        """Cancel an async job's task at its timeout (on the loop's thread)."""
        assert self.loop is not None
        self.loop.call(_cancel, flight)

    def _start_tasks(self, flights: list[Flight]) -> None:
        loop = asyncio.get_running_loop()
        for flight in flights:
            task = loop.create_task(self._run(flight))
            task.add_done_callback(functools.partial(self._task_ended, flight))

    def _task_ended(self, flight: Flight, task: asyncio.Task[str]) -> None:
        if not self._turn_ends:
            asyncio.get_running_loop().call_soon(self._after_turn)
        self._turn_ends.append((flight, _outcome(task)))

    def _after_turn(self) -> None:
        ended, self._turn_ends = self._turn_ends, []
        self.host.ended_together(ended)

    async def _run(self, flight: Flight) -> str:
        host = self.host
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
            host._start(job)
            value = await spec.func(job)   # type: ignore[misc]
            flight.returned = True
            if flight.cancelled and not job.completed:
                # Still running at its timeout, so cancelled, but the cancel
                # never reached it: it held the loop (blocking code) until
                # it returned.  Timed out all the same, not completed.
                raise LeaseLost(job.id, job.attempt, "timeout")
            if job.completed:
                await _keep_result(job, value, spec.store_result)
            else:
                job._result = results.encode(value, store=spec.store_result)
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
            outcome = await asyncio.get_running_loop().run_in_executor(self._reporters, host._after_error,
                                                                      job, error)
        return outcome


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


async def _keep_result(job: AsyncJob, value: object, store: bool) -> None:
    """As the engine's ``_keep_result``, for an async job its handler's
    fenced block completed."""
    try:
        job._result = results.encode(value, store=store)
        if job._result is not None:
            await job.store_result()
    except PgfenceError as exc:
        log.warning("job %s is done, but its result was not stored: %s", job.id, exc)
