"""The pools a worker's jobs write on, when their connections die while idle.

A worker that runs many jobs at once keeps the connections its jobs wrote on
in a pool between jobs.  One of them ended while it sat there (the load
test's ``terminate`` fault, a server's idle_session_timeout, a PgBouncer or
proxy that drops idle clients) must not cost the next job that borrows it an
attempt: the borrow finds it dead and takes another.  These tests end every
idle pool connection of a running worker with pg_terminate_backend between
two rounds of jobs; every job of the second round must be done on attempt 1,
with no error recorded, both the jobs that write through the fence (their
own borrow) and those that write nothing (the worker's batched completion,
on a pool connection too).
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from pgtools import wait_for
from pgfence import AsyncJob, Job, enqueue, handler, registry
from pgfence.settings import Settings
from pgfence.worker.engine import ConcurrentWorker

#: Jobs per round: more than the slots, so the pool opens several connections.
ROUND = 12


def _register(side: str) -> tuple[str, str]:
    """The kinds of one side, the only ones the worker knows (the test
    process's built-ins are set aside until the test ends): (writes through
    the fence, writes nothing)."""
    registry._REGISTRY.clear()
    if side == "threads":
        @handler("t_pool_write")
        def write(job: Job) -> None:
            with job.fenced() as conn:
                conn.execute("SELECT pg_sleep(0.01)")

        @handler("t_pool_quiet")
        def quiet(job: Job) -> None:
            pass

        return "t_pool_write", "t_pool_quiet"

    @handler("t_apool_write")
    async def awrite(job: AsyncJob) -> None:
        async with job.fenced() as conn:
            await conn.execute("SELECT pg_sleep(0.01)")

    @handler("t_apool_quiet")
    async def aquiet(job: AsyncJob) -> None:
        pass

    return "t_apool_write", "t_apool_quiet"


def _pool_backends(conn: psycopg.Connection, worker: ConcurrentWorker) -> list[int]:
    """The server pids of the worker's pool connections: its sessions but
    the claiming connection."""
    own = worker._conn.info.backend_pid if worker._conn is not None else 0
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s"
        " AND pid <> %s", (f"pgfence worker {worker.name}", own))]


def _round(conn: psycopg.Connection, kinds: tuple[str, str]) -> list[int]:
    """Enqueue a round of both kinds; wait until none is queued or running."""
    ids = [enqueue(conn, kinds[i % 2]) for i in range(ROUND)]
    wait_for(lambda: conn.execute("SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s)"
                                  " AND status IN ('done', 'failed', 'cancelled')", (ids,)).fetchone()[0] == ROUND,
             timeout=30, message="the round's jobs finished")
    return ids


@pytest.mark.parametrize("side", ["threads", "async"])
def test_a_pool_connection_that_died_idle_costs_no_job_an_attempt(dsn, conn, side):
    kinds = _register(side)
    settings = (Settings(renew=False, threads=4) if side == "threads"
                else Settings(renew=False, async_concurrency=4))
    worker = ConcurrentWorker(dsn, settings, name=f"w-pool-{side}")
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        _round(conn, kinds)
        idle = wait_for(lambda: _pool_backends(conn, worker), timeout=10, message="the pool's connections")
        ended = [r[0] for r in conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid",
                                            (idle,))]
        assert ended == [True] * len(idle)
        wait_for(lambda: not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)",
                                          (idle,)).fetchone(), timeout=10, message="the pool's sessions gone")
        ids = _round(conn, kinds)
        rows = conn.execute("SELECT status, attempt, last_error FROM pgfence.all_jobs WHERE id = ANY(%s)"
                            " ORDER BY id", (ids,)).fetchall()
        assert rows == [("done", 1, None)] * ROUND
        # The second round wrote on new connections: the dead ones are gone.
        assert not set(_pool_backends(conn, worker)) & set(idle)
    finally:
        worker.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    assert worker.stats.outcomes == {"done": 2 * ROUND}
