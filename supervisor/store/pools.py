"""The connection pools of a worker that runs many jobs at once.

A job in flight writes (its ``fenced()`` block, its error report, its
release) on a connection of its own, borrowed from the worker's pool for
that write only: a job that waits on the network holds no connection.  The
threads share a :class:`psycopg_pool.ConnectionPool` of at most ``threads``
connections; the event loop an :class:`psycopg_pool.AsyncConnectionPool` of
at most :data:`ASYNC_MAX` connections.  Both are opened after the fork (a
pool's threads and sockets never cross one), configured as the worker's own
connection is: autocommit, prepared statements unless behind a
transaction-pooling PgBouncer, and the idle-in-transaction timeout.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgfence.store import db, renewals

#: The most connections one worker's event loop opens for its jobs' writes.
#: A job holds one only inside ``fenced()``/``fenced_writes()`` (a few ms for
#: a one-row write), so ten serve thousands of completions a second.
ASYNC_MAX = 10


def _kwargs(prepare: bool) -> dict[str, Any]:
    return {"autocommit": True, "prepare_threshold": db.prepare_threshold(prepare)}


def open_threads_pool(dsn: str, *, size: int, application_name: str, prepare: bool, idle_ms: str,
                      timeout: float) -> ConnectionPool:
    """The threads' pool: opened now, no connection made until a job
    writes; ``timeout`` is how long a write waits for a connection (an
    unreachable database) before it fails as unavailable."""
    def configure(conn: psycopg.Connection[Any]) -> None:
        renewals.session_settings(conn, idle_ms)

    pool: ConnectionPool = ConnectionPool(
        db.conninfo(dsn, application_name=application_name), min_size=0, max_size=size, open=False,
        timeout=timeout, kwargs=_kwargs(prepare), configure=configure, name="pgfence-jobs")
    pool.open(wait=False)
    return pool


async def open_async_pool(dsn: str, *, size: int, application_name: str, prepare: bool, idle_ms: str,
                          timeout: float) -> AsyncConnectionPool:
    """The event loop's pool, opened on that loop."""
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await renewals.session_settings_async(conn, idle_ms)

    pool: AsyncConnectionPool = AsyncConnectionPool(
        db.conninfo(dsn, application_name=application_name), min_size=0, max_size=min(size, ASYNC_MAX),
        open=False, timeout=timeout, kwargs=_kwargs(prepare), configure=configure, name="pgfence-async-jobs")
    await pool.open(wait=False)
    return pool
