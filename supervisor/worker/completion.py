"""Batched completion: the jobs whose handlers wrote nothing of their own are
completed together, each fenced by its own ``(id, attempt)``, in one
statement.

Every slot kind hands such a job here (outcome ``deferred``), still holding
its lease.  The one-job slot completes its batch on the claiming thread, at
the batch's end or once the oldest has waited ``DEFER_MAX`` seconds; the
threads and the event loop hand theirs to the completer thread, which
completes them as soon as there are any, while the next claim runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psycopg

from pgfence.errors import DatabaseError
from pgfence.job import JobBase
from pgfence.observe import metrics
from pgfence.store import db, pools
from pgfence.store import jobs as store
from pgfence.worker.outcomes import DONE, LOST, Outcomes

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger("pgfence.worker")

#: Seconds a finished job may wait for its batched completion (one-job slot).
DEFER_MAX = 0.1


class Completing(Outcomes):
    """The engine's part that completes deferred jobs."""

    def _completion_conn(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        raise NotImplementedError

    def complete_deferred(self, jobs: list[JobBase]) -> int:
        """Complete many jobs in ONE statement, each fenced by its own
        ``(id, attempt)``; a job the fence refuses lost its lease like any
        other.  Returns how many were completed."""
        if not jobs:
            return 0
        ids, attempts, results = [j.id for j in jobs], [j.attempt for j in jobs], [j._result for j in jobs]
        unavailable = False
        try:
            # A deadlock or serialization failure wrote nothing: run again at once.
            with self._completion_conn() as conn:
                done = db.retrying(lambda: store.complete_many(conn, ids, attempts, results),
                                   self.dsn, what="batched completion")
        except DatabaseError as exc:
            # Not known to be refused: the jobs stay running and are reclaimed
            # when their leases run out.
            log.warning("batched completion failed: %s", exc)
            self._forget_connection(exc)
            done, unavailable = set(), True
        refused = [] if unavailable else [job for job in jobs if job.id not in done]
        completed = self.settle(jobs, done, unavailable=unavailable)
        self.note_rejected(refused)
        return completed

    def settle(self, jobs: list[JobBase], done: set[int], *, unavailable: bool) -> int:
        """After a batched completion: the jobs in ``done`` are completed,
        the others lost (refused by the fence, or, when the database was
        ``unavailable``, not known to be completed); every lease untracked
        and ``jobs`` emptied.  Returns how many were completed."""
        completed: dict[tuple[str, str], int] = {}
        for job in jobs:
            if self.heartbeat is not None:
                self.heartbeat.untrack(job.lease)
            if job.id in done:
                job.completed = True
                completed[job.queue, job.kind] = completed.get((job.queue, job.kind), 0) + 1
                self.stats.add(DONE)
            else:
                if unavailable:
                    job.lease.mark_lost("renewal_failed")
                else:
                    job._rejected()
                self.stats.add(LOST)
        for (queue, kind), count in completed.items():   # once per batch, not per job
            metrics.of(metrics.JOBS_COMPLETED, queue, kind).inc(count)
        jobs.clear()
        return len(done)


class Completer:
    """The completer thread of a worker whose jobs run on threads or on an
    event loop: completes what :meth:`add` gathered, in one statement per
    round, and calls ``settled(jobs)`` after each round (completed or not,
    their leases are untracked then)."""

    def __init__(self, complete: Callable[[list[JobBase]], int], settled: Callable[[list[JobBase]], None],
                 every: float) -> None:
        self._complete = complete
        self._settled = settled
        self._every = every
        self._lock = threading.Lock()
        self._jobs: list[JobBase] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pgfence-completer", daemon=True)
        self._thread.start()

    def add(self, job: JobBase) -> None:
        with self._lock:
            self._jobs.append(job)
        self._ready.set()

    def flush(self) -> None:
        """Complete, in one fenced statement, the jobs gathered so far."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        batch = list(jobs)
        try:
            self._complete(jobs)
        finally:
            self._settled(batch)

    def stop(self, timeout: float) -> None:
        """End the thread (after its round under way), then complete what is
        left on the calling thread."""
        self._stop.set()
        self._ready.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - stopping: the leases run out and the jobs are reclaimed
            log.warning("could not complete the last jobs: %s", db.first_line(exc))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._ready.wait(self._every)
            self._ready.clear()
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - never let the completer die: the leases bring the jobs back
                log.error("batched completion failed: %s: %s", type(exc).__name__, db.first_line(exc))


@contextlib.contextmanager
def on_pool(pool: ConnectionPool, dsn: str) -> Iterator[psycopg.Connection]:
    """A connection of ``pool`` for one batched completion."""
    with db.translated(dsn), pools.connection(pool) as conn:
        yield conn

