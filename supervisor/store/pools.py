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

Every borrow goes through :func:`connection` (or :func:`getconn_async`),
which never hands out a connection that died while it sat idle in the pool
(a server that ended the session: ``pg_terminate_backend``, a restart, an
idle timeout, a proxy that dropped it), so no job spends an attempt on a
connection it never used.  A server that ends a session first sends it an
error and closes it, so such a connection has something to read while
nothing of ours is in flight: a poll of its socket, without a round trip,
tells the dead ones, and only a connection with something to read is asked
(an empty query) whether it still stands.  psycopg_pool's own ``check``
would cost every borrow a round trip (a one-row fenced write is one), and it
waits 1 s, then 2 s... between two failed checks, so a pool whose every
connection was ended would stall a write past its timeout.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

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


def _heard_from(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection has something to read (or is known
    closed): the server ended it, or, rarely, sent a notice."""
    if conn.closed:
        return True
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def alive(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection still stands: asked with an empty query
    only when it has something to read (see :func:`_heard_from`)."""
    if not _heard_from(conn):
        return True
    try:
        conn.execute("")
    except psycopg.Error:
        return False
    return True


async def alive_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """:func:`alive` for an async connection."""
    if not _heard_from(conn):
        return True
    try:
        await conn.execute("")
    except psycopg.Error:
        return False
    return True


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def getconn(pool: ConnectionPool, timeout: float | None = None) -> psycopg.Connection[Any]:
    """A connection of ``pool`` that did not die while idle in it; give it
    back with ``pool.putconn``.  A dead one is closed and given back (the
    pool opens another in its place), and the next is taken, within
    ``timeout`` (the pool's) in all: ``PoolTimeout`` past it."""
    deadline = time.monotonic() + (pool.timeout if timeout is None else timeout)
    while True:
        conn = pool.getconn(timeout=_left(deadline))
        try:
            if alive(conn):
                return conn
            conn.close()
            pool.putconn(conn)
        except BaseException:
            pool.putconn(conn)
            raise


async def getconn_async(pool: AsyncConnectionPool, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
    """As :func:`getconn`, from the event loop's pool."""
    deadline = time.monotonic() + (pool.timeout if timeout is None else timeout)
    while True:
        conn = await pool.getconn(timeout=_left(deadline))
        try:
            if await alive_async(conn):
                return conn
            await conn.close()
            await pool.putconn(conn)
        except BaseException:
            await pool.putconn(conn)
            raise


@contextlib.contextmanager
def connection(pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
    """``pool.connection()``, but never with a connection that died idle."""
    conn = getconn(pool)
    try:
        with conn:
            yield conn
    finally:
        pool.putconn(conn)



class Reconnecting:
    """A pool (the heartbeat manager's, of one connection) that a caller
    starved of a connection makes try again at once.

    psycopg_pool waits 1 s, 2 s, 4 s... between two failed attempts to
    connect, without a cap: after an outage of a few seconds the pool could
    still be waiting out its backoff well after the database was back, and a
    short lease ran out though the database answered.  So a borrow that gets
    no connection in its time (``PoolTimeout``) replaces the pool by a new
    one, made by ``make`` and opened at once, whose first attempt starts
    now; unless the pool failed no attempt since it last handed out a
    connection (an attempt may be under way, and a slow connect is let
    finish)."""

    def __init__(self, make: Callable[[], ConnectionPool]) -> None:
        self._make = make
        self.pool = make()
        self.opened = False
        #: Pools replaced by a new one.
        self.resets = 0
        self._errors_seen = 0
        self._lock = threading.Lock()

    def open(self) -> None:
        """Open the pool (no connection is waited for)."""
        with self._lock:
            if not self.opened:
                self.pool.open(wait=False)
                self.opened = True

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """:func:`connection` of the pool, waiting at most ``timeout`` (the
        pool's) for it."""
        self.open()
        pool = self.pool
        try:
            conn = getconn(pool, timeout)
        except PoolTimeout:
            self._starved(pool)
            raise
        self._errors_seen = _errors(pool)
        try:
            with conn:
                yield conn
        finally:
            pool.putconn(conn)

    def _starved(self, pool: ConnectionPool) -> None:
        with self._lock:
            if pool is not self.pool or not self.opened or _errors(pool) <= self._errors_seen:
                return
            self.pool = self._make()
            self.pool.open(wait=False)
            self._errors_seen = 0
            self.resets += 1
        # An attempt of the old pool still under way ends in its own thread.
        pool.close(timeout=0)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self.opened:
                self.pool.close(timeout=timeout)
                self.opened = False


def _errors(pool: ConnectionPool) -> int:
    """How many attempts to connect ``pool`` failed."""
    return int(pool.get_stats().get("connections_errors", 0))
