"""The load test's own statements (``sql/queries/loadtest.sql``): enqueue
the jobs, follow the queue, gather the evidence.  Everything is filtered by
the run's queue, so other jobs in the same database are never counted."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgfence.store.queries import q
from pgfence.tools.loadtest.mix import JobSpec

ENQUEUE_CHUNK = 5000


def enqueue(conn: psycopg.Connection[Any], queue: str, specs: list[JobSpec]) -> dict[int, str]:
    """Enqueue every job in ONE transaction (workers see them all at once);
    return job id -> mix name."""
    ids: dict[int, str] = {}
    with conn.transaction():
        for start in range(0, len(specs), ENQUEUE_CHUNK):
            chunk = specs[start:start + ENQUEUE_CHUNK]
            rows = conn.execute(q("loadtest_enqueue"), {
                "queue": queue, "kinds": [s.kind for s in chunk], "payloads": [Jsonb(s.payload) for s in chunk],
                "attempts": [s.max_attempts for s in chunk], "reclaims": [s.max_reclaims for s in chunk],
            }).fetchall()
            for n, job_id in rows:
                ids[job_id] = chunk[n - 1].mix
    return ids


def states(conn: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    rows = conn.execute(q("loadtest_states"), {"queue": queue}).fetchall()
    return {status: n for status, n in rows}


def _one(cur: psycopg.Cursor[Any]) -> Any:
    """The single value of a query that always returns one row."""
    row = cur.fetchone()
    assert row is not None
    return row[0]


def deadlocks(conn: psycopg.Connection[Any]) -> int:
    """Deadlocks detected in this database so far (pg_stat_database)."""
    return int(_one(conn.execute(q("loadtest_deadlocks"))))


def clock(conn: psycopg.Connection[Any]) -> Any:
    """The database clock now."""
    return _one(conn.execute(q("loadtest_clock")))


def _dicts(cur: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    names = [c.name for c in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def jobs(conn: psycopg.Connection[Any], queue: str) -> list[dict[str, Any]]:
    return _dicts(conn.execute(q("loadtest_jobs"), {"queue": queue}))


def rows_by_job(conn: psycopg.Connection[Any], queue: str, table: str) -> dict[int, list[dict[str, Any]]]:
    """The run's rows of pgfence.effects or pgfence.receipts, per job, in
    commit order."""
    query = {"effects": "loadtest_effects", "receipts": "loadtest_receipts"}[table]
    out: dict[int, list[dict[str, Any]]] = {}
    for row in _dicts(conn.execute(q(query), {"queue": queue})):
        out.setdefault(row["job_id"], []).append(row)
    return out


def cancel_leftovers(conn: psycopg.Connection[Any], queue: str) -> int:
    """Cancel the run's jobs still queued or running once its supervisors are
    gone (an interrupted or timed-out run), so none is left behind."""
    return conn.execute(q("loadtest_cancel_leftovers"), {"queue": queue}).rowcount
