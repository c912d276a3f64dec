"""The load test's statements (``loadtest.sql`` beside this module): one
function per named query, typed rows.  Each is filtered by the run's queue, so other jobs
in the same database are never counted."""

from __future__ import annotations

import datetime
from typing import NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from pgfence.store.queries import queries_in

q = queries_in("pgfence.tools.loadtest", "loadtest.sql")


class Enqueued(NamedTuple):
    #: The job's place in its chunk, from 1.
    n: int
    id: int


def enqueue_chunk(conn: psycopg.Connection, queue: str, *, kinds: list[str], payloads: list[Jsonb],
                  attempts: list[int], reclaims: list[int], keys: list[str | None]) -> list[Enqueued]:
    """Enqueue one chunk of the run's jobs (parallel lists; ``keys``: each
    job's concurrency key or None), in the caller's transaction; each job's
    place in the chunk and its id."""
    params = {"queue": queue, "kinds": kinds, "payloads": payloads, "attempts": attempts, "reclaims": reclaims,
              "keys": keys}
    return [Enqueued._make(row) for row in conn.execute(q("loadtest_enqueue"), params).fetchall()]


def states(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    """The run's jobs counted by status."""
    return {status: n for status, n in conn.execute(q("loadtest_states"), {"queue": queue}).fetchall()}


class AuditedJob(NamedTuple):
    id: int
    kind: str
    status: str
    attempt: int
    reclaims: int
    last_error: str | None
    created_at: datetime.datetime
    run_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None


def jobs(conn: psycopg.Connection, queue: str) -> list[AuditedJob]:
    """Every job of the run, by id."""
    return [AuditedJob._make(row) for row in conn.execute(q("loadtest_jobs"), {"queue": queue}).fetchall()]


class Effect(NamedTuple):
    job_id: int
    id: int
    attempt: int
    worker: str


def effects(conn: psycopg.Connection, queue: str) -> list[Effect]:
    """The run's committed effect rows, per job in commit order."""
    return [Effect._make(row) for row in conn.execute(q("loadtest_effects"), {"queue": queue}).fetchall()]


class Attempt(NamedTuple):
    job_id: int
    attempt: int
    outcome: str
    started_at: datetime.datetime | None
    ended_at: datetime.datetime


def attempts(conn: psycopg.Connection, ids: list[int]) -> list[Attempt]:
    """The attempts pgfence.job_attempts records for the jobs ``ids``, by
    job, attempt and outcome."""
    return [Attempt._make(row) for row in conn.execute(q("loadtest_attempts"), {"ids": ids}).fetchall()]


class Receipt(NamedTuple):
    job_id: int
    id: int
    attempt: int
    sent_status: str


def receipts(conn: psycopg.Connection, queue: str) -> list[Receipt]:
    """The run's committed receipt rows, per job in commit order."""
    return [Receipt._make(row) for row in conn.execute(q("loadtest_receipts"), {"queue": queue}).fetchall()]


def cancel_leftovers(conn: psycopg.Connection, queue: str) -> int:
    """Cancel the run's jobs still queued or running; how many."""
    return conn.execute(q("loadtest_cancel_leftovers"), {"queue": queue}).rowcount


class Backend(NamedTuple):
    pid: int
    backend_start: datetime.datetime
    application_name: str


def backends(conn: psycopg.Connection, pids: list[int], dbname: str) -> list[Backend]:
    """The run's worker and heartbeat backends among ``pids``, by pid."""
    rows = conn.execute(q("loadtest_backends"), {"pids": pids, "dbname": dbname}).fetchall()
    return [Backend._make(row) for row in rows]


def terminate(conn: psycopg.Connection, pid: int, started: datetime.datetime) -> bool:
    """Terminate the backend ``pid`` if it is still the one started at
    ``started``; whether it was."""
    row = conn.execute(q("loadtest_terminate"), {"pid": pid, "started": started}).fetchone()
    return row is not None and bool(row[0])


def deadlocks(conn: psycopg.Connection) -> int:
    """Deadlocks PostgreSQL detected in this database so far (cumulative)."""
    row = conn.execute(q("loadtest_deadlocks")).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def clock(conn: psycopg.Connection) -> datetime.datetime:
    """The database clock now."""
    row = conn.execute(q("loadtest_clock")).fetchone()
    if row is None:
        raise AssertionError("loadtest_clock returned no row")
    now: datetime.datetime = row[0]
    return now


def max_connections(conn: psycopg.Connection) -> int:
    """The server's max_connections."""
    row = conn.execute(q("loadtest_max_connections")).fetchone()
    if row is None:
        raise AssertionError("loadtest_max_connections returned no row")
    return int(row[0])


def hold_snapshot(conn: psycopg.Connection) -> tuple[int, int]:
    """Take the snapshot of ``conn``'s REPEATABLE READ transaction, which
    then holds the xmin horizon until it ends; its backend pid and xmin."""
    row = conn.execute(q("loadtest_hold_snapshot")).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
