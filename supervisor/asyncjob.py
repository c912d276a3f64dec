"""The Job an ``async def`` handler receives.

::

    @handler("send_webhook")
    async def send_webhook(job: AsyncJob) -> None:
        job.check()                            # never waits: no await
        await post(job.payload["url"], key=job.idempotency_key)
        async with job.fenced() as conn:       # the handler's writes + the fenced completion
            await conn.execute("INSERT ...")

It runs on the worker's event loop, with up to ``async_concurrency`` others.
The fields and the keys are those of :class:`~pgfence.Job`; ``check()`` and
``lease_lost`` read what the worker knows and never wait.  A handler that
never opens ``fenced()`` (nor ``fenced_writes()``) is completed, fenced, by
the worker when it returns.  ``fenced()`` borrows a connection of the
worker's event-loop pool for the block only, so a job that waits on the
network holds none.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgfence.errors import LeaseLost, NotCommitted, TransactionConflict
from pgfence.job import JobBase, Writes
from pgfence.store import db, jobs, pools, sqltext
from pgfence.worker.lease import Lease


class AsyncJob(JobBase):
    """One attempt of one job, as an ``async def`` handler sees it."""

    pool: AsyncConnectionPool | None

    def __init__(self, id: int, kind: str, queue: str, attempt: int, payload: Any, lease: Lease,
                 max_attempts: int = 1, dedupe_key: str | None = None, *,
                 pool: AsyncConnectionPool | None = None, fence: bool = True, completed: bool = False) -> None:
        super().__init__(id, kind, queue, attempt, payload, lease, max_attempts, dedupe_key, fence=fence,
                         completed=completed)
        self.pool = pool

    @contextlib.asynccontextmanager
    async def borrow(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the worker's event-loop pool, for one write.

        The pool has far fewer connections than the loop has jobs: when
        every one of them is open and busy with other jobs' writes, a wait
        past the pool's timeout is a queue, not an outage, and the job
        waits on while its lease holds (``check()`` raises once it is
        lost).  A pool that could not open its connections in time is an
        outage: ``PoolTimeout``, reported as the database unavailable."""
        pool = self.pool
        if pool is None:
            raise RuntimeError("this job is not attached to a worker's pool")
        while True:
            try:
                conn = await pools.getconn_async(pool)
                break
            except PoolTimeout:
                if pool.get_stats().get("pool_size", 0) < pool.max_size:
                    raise
                self.check()
        try:
            async with conn:
                yield conn
        finally:
            await pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def fenced(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A transaction holding the handler's writes and the fenced
        completion, as :meth:`pgfence.Job.fenced`: on a clean exit of the
        block the job is marked done in the same transaction, but only if
        this attempt still owns it; otherwise every write of the block is
        rolled back and :class:`~pgfence.LeaseLost` is raised."""
        self._not_completed()
        with db.translated():
            async with self.borrow() as conn:
                try:
                    with db.translated():
                        async with conn.transaction():
                            yield conn
                            done = (await jobs.complete_async(conn, self.id, self.attempt, self._result)
                                    if self.fence
                                    else await jobs.complete_unfenced_async(conn, self.id))
                            if not done:
                                self._rejected()
                                raise LeaseLost(self.id, self.attempt, "fence_rejected")
                except TransactionConflict as exc:
                    self._conflicted(exc)
        self.completed = True

    async def store_result(self) -> None:
        """As :meth:`pgfence.Job.store_result`."""
        assert self._result is not None
        with db.translated():
            async with self.borrow() as conn, conn.transaction():
                await jobs.store_result_async(conn, self.id, self.attempt, self._result)

    @contextlib.asynccontextmanager
    async def fenced_writes(self) -> AsyncIterator[Writes]:
        """As :meth:`pgfence.Job.fenced_writes`: the block queues statements
        with ``writes.execute(query, params)`` (not awaited); when it ends,
        BEGIN, the statements, the fenced completion and COMMIT go to the
        server in one message."""
        self._not_completed()
        writes = Writes()
        yield writes
        writes.execute(*self._raising_completion())
        with db.translated():
            async with self.borrow() as conn:
                try:
                    async with psycopg.AsyncClientCursor(conn) as cursor:
                        standard = conn.info.parameter_status("standard_conforming_strings") != "off"
                        statements = [sqltext.one_statement(cursor.mogrify(query, params), standard_strings=standard)
                                      for query, params in writes.statements]
                        script = ";\n".join(["BEGIN", *statements, "COMMIT"]).encode(conn.info.encoding)
                        await cursor.execute(script)
                        answers = [(cursor.statusmessage, cursor.rowcount)]
                        while cursor.nextset():
                            answers.append((cursor.statusmessage, cursor.rowcount))
                except BaseException as exc:
                    rejected = db.fence_refused(exc)
                    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        try:
                            await conn.rollback()
                        except psycopg.Error:
                            await conn.close()
                    if rejected:
                        self._rejected()
                        raise LeaseLost(self.id, self.attempt, "fence_rejected") from None
                    raise
                expected = len(statements) + 2
                status = conn.info.transaction_status
                if (status != psycopg.pq.TransactionStatus.IDLE or len(answers) != expected
                        or answers[-1][0] != "COMMIT" or answers[-2][1] != 1):
                    raise NotCommitted(f"job {self.id} attempt {self.attempt}: the one-message block did not "
                                       f"commit ({len(answers)} of {expected} statements answered, last "
                                       f"{answers[-1][0]!r}, connection {status.name}); its writes were rolled back")
        self.completed = True
