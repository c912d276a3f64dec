"""Claims and batched completions made on a worker's event loop.

In a worker whose handlers are all ``async def``, a job goes from its claim
to its task and from its end to its batched completion on the loop's own
thread: the loop claims over a connection of its own as soon as it has free
slots (as many jobs as are free, never more than ``batch``), starts each job
as a task, and completes together, fenced, the jobs that ended without
writing, on a second connection, while the next claim runs.  No job waits
for another thread to pick it up, and the interpreter does not switch
threads for each job.

The worker's claiming thread keeps the rest: it starts these claims, and
while the loop claims it only watches (timeouts, a blocked loop, a stop).
Once a claim finds nothing, the loop stops claiming and says so
(:attr:`LoopClaims.parked`); the claiming thread then waits, as it does for
its own claims, for an enqueue's NOTIFY or the next run_at, and starts the
loop's claims again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from pgfence.errors import DatabaseError, DatabaseUnavailable
from pgfence.store import db, pools, renewals
from pgfence.store import jobs as store

if TYPE_CHECKING:
    from pgfence.asyncjob import AsyncJob
    from pgfence.worker.aio import EventLoop
    from pgfence.worker.concurrent import ConcurrentWorker

log = logging.getLogger("pgfence.worker")

#: Why the loop stopped claiming: a claim found no job; or the worker
#: stopped its claims (a stop, a recycle, the job limit reached, a release
#: still owed after an outage).
EMPTY, STOPPED = "empty", "stopped"


class LoopClaims:
    """The claims and the batched completions of one worker, on its loop.

    :meth:`resume` and :meth:`halt` are called from the worker's claiming
    thread; everything else runs on the loop's thread."""

    def __init__(self, worker: ConcurrentWorker, loop: EventLoop) -> None:
        self.worker = worker
        self.loop = loop
        #: Set while the loop is not claiming (the claiming thread's cue).
        self.parked = threading.Event()
        self.parked.set()
        #: Why the loop last stopped claiming: EMPTY, STOPPED, or the
        #: database error that ended its claims (None once read).
        self.outcome: str | DatabaseError | None = None
        self._conns: dict[str, psycopg.AsyncConnection[Any]] = {}
        self._deferred: list[AsyncJob] = []
        self._freed: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._completer: asyncio.Task[None] | None = None
        self._claimer: asyncio.Task[None] | None = None
        self._closing = False

    # -- on the claiming thread ------------------------------------------------------

    def resume(self) -> None:
        """Claim on the loop until a claim finds nothing or the worker
        stops claiming."""
        self.parked.clear()
        self.outcome = None
        self.loop.call(self._spawn)

    def halt(self, timeout: float) -> bool:
        """Ask the loop to stop claiming and wait up to ``timeout`` seconds
        for it to stop (the jobs of a claim under way are started first);
        True once it has."""
        if self.parked.is_set():
            return True
        self.loop.call(self.freed)
        return self.parked.wait(timeout)

    # -- on the loop -----------------------------------------------------------------

    async def start(self) -> None:
        self._freed = asyncio.Event()
        self._ready = asyncio.Event()
        self._completer = asyncio.create_task(self._complete_rounds(), name="pgfence-loop-completer")

    def freed(self) -> None:
        """A slot may have come free: a claim waiting for one goes ahead."""
        if self._freed is not None:
            self._freed.set()

    def defer(self, job: AsyncJob) -> None:
        """A job ended without writing: completed with others, soon."""
        self._deferred.append(job)
        assert self._ready is not None
        self._ready.set()

    def _spawn(self) -> None:
        self._claimer = asyncio.get_running_loop().create_task(self._claims(), name="pgfence-loop-claims")

    async def _claims(self) -> None:
        outcome: str | DatabaseError = STOPPED
        try:
            outcome = await self._claim_until_empty()
        except DatabaseError as exc:
            outcome = exc
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the claiming thread waiting for ever
            log.error("claims on the event loop failed: %s: %s", type(exc).__name__, db.first_line(exc))
            outcome = DatabaseError(f"claims on the event loop failed: {type(exc).__name__}")
        finally:
            self.outcome = outcome
            self.parked.set()

    async def _claim_until_empty(self) -> str:
        worker = self.worker
        assert self._freed is not None
        while True:
            size = worker.loop_claim_size()
            if size is None:
                return STOPPED
            if size == 0:
                # Every slot taken: wait for a job to end.  Cleared before
                # the size is read again, so an end in between is not missed.
                self._freed.clear()
                if worker.loop_claim_size() == 0:
                    await self._freed.wait()
                continue
            args, sent_at = worker.claim_args(size, None, None)
            rows = await self._run("claim", functools.partial(_claim, args=args))
            if not rows:
                return EMPTY
            worker.dispatch_all(worker.adopt(rows, sent_at), on_loop=True)

    async def _complete_rounds(self) -> None:
        assert self._ready is not None
        while not (self._closing and not self._deferred):
            await self._ready.wait()
            self._ready.clear()
            try:
                await self.complete_now()
            except Exception as exc:  # noqa: BLE001 - never let the completer die: the leases bring the jobs back
                log.error("batched completion failed: %s: %s", type(exc).__name__, db.first_line(exc))

    async def complete_now(self) -> None:
        """Complete, in one fenced statement, the jobs that ended without
        writing; the next round's jobs gather while it runs."""
        jobs, self._deferred = self._deferred, []
        if not jobs:
            return
        count = len(jobs)
        ids, attempts = [j.id for j in jobs], [j.attempt for j in jobs]
        done: set[int] = set()
        # Until the statement answers, not known to be refused (nor done):
        # the jobs stay running and are reclaimed when their leases run out.
        unavailable = True
        try:
            done = await self._run("completion", lambda conn: db.retrying_async(
                lambda: store.complete_many_async(conn, ids, attempts), self.worker.dsn,
                what="batched completion"))
            unavailable = False
        except DatabaseError as exc:
            log.warning("batched completion failed: %s", exc)
        finally:
            refused = [] if unavailable else [job for job in jobs if job.id not in done]
            # Completed or not, their leases are untracked now.
            try:
                self.worker.settle(jobs, done, unavailable=unavailable)  # type: ignore[arg-type]
            finally:
                self.worker.completed_on_loop(count)
        if refused:
            await self._note_rejected(refused)

    async def _note_rejected(self, jobs: list[AsyncJob]) -> None:
        """Record that the fence refused these jobs' completion (see
        Worker.note_rejected), on this loop's completion connection."""
        now = time.monotonic()
        ran = [now - (job.lease.started_at or job.lease.claimed_at) for job in jobs]
        try:
            await self._run("completion", lambda conn: store.note_fence_rejected_async(
                conn, [job.id for job in jobs], [job.attempt for job in jobs], ran, worker=self.worker.name))
        except DatabaseError as exc:
            log.warning("could not record the refused completion of %d job(s): %s", len(jobs), exc)

    async def _run(self, role: str, statement: Any) -> Any:
        """``statement(conn)`` on this loop's connection for ``role``
        (opened on first use); a connection that broke is dropped, and the
        next statement opens another."""
        conn = self._conns.get(role)
        if conn is not None and not await pools.alive_async(conn):
            # Ended by the server while idle (a terminate, an idle timeout,
            # a proxy): replaced before the statement, so it costs no job
            # anything.
            await conn.close()
            conn = None
        try:
            if conn is None or conn.closed:
                conn = self._conns[role] = await self._connect()
            with db.translated(self.worker.dsn):
                return await statement(conn)
        except DatabaseError as exc:
            if conn is not None and (isinstance(exc, DatabaseUnavailable) or conn.closed):
                self._conns.pop(role, None)
                await conn.close()
            raise

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        worker = self.worker
        conn = await db.connect_async(worker.dsn, application_name=f"pgfence worker {worker.name}",
                                      prepare=worker.settings.prepare)
        with db.translated(worker.dsn):
            # As the worker's own connection: an idle-in-transaction timeout.
            await renewals.session_settings_async(conn, worker.settings.idle_in_transaction_ms)
        return conn

    async def close(self, timeout: float) -> None:
        """Complete what is left (waiting up to ``timeout`` seconds for the
        completion under way), then close the connections.  The claims have
        stopped (:meth:`halt`) before."""
        if self._claimer is not None and not self._claimer.done():
            self._claimer.cancel()
        self._closing = True
        try:
            if self._completer is not None and self._ready is not None:
                self._ready.set()
                await asyncio.wait_for(self._completer, timeout)
        finally:
            for conn in self._conns.values():
                await conn.close()
            self._conns.clear()


async def _claim(conn: psycopg.AsyncConnection[Any], *, args: dict[str, Any]) -> list[store.Claimed]:
    return await store.claim_async(conn, **args)
