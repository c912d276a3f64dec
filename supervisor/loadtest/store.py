"""The load test's own SQL: enqueue the jobs, follow the queue, gather the
evidence.  Everything is filtered by the run's queue, so other jobs in the
same database are never counted."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .mix import JobSpec

ENQUEUE_CHUNK = 5000

ENQUEUE = """
SELECT u.n, pgfence.enqueue(u.kind, u.payload, %(queue)s, 0, NULL, u.max_attempts, NULL, u.max_reclaims)
  FROM unnest(%(kinds)s::text[], %(payloads)s::jsonb[], %(attempts)s::int[], %(reclaims)s::int[])
       WITH ORDINALITY AS u(kind, payload, max_attempts, max_reclaims, n)
 ORDER BY u.n
"""


def enqueue(conn: psycopg.Connection, queue: str, specs: list[JobSpec]) -> dict[int, str]:
    """Enqueue every job in ONE transaction (workers see them all at once);
    return job id -> mix name."""
    ids: dict[int, str] = {}
    with conn.transaction():
        for start in range(0, len(specs), ENQUEUE_CHUNK):
            chunk = specs[start:start + ENQUEUE_CHUNK]
            rows = conn.execute(ENQUEUE, {
                "queue": queue, "kinds": [s.kind for s in chunk], "payloads": [Jsonb(s.payload) for s in chunk],
                "attempts": [s.max_attempts for s in chunk], "reclaims": [s.max_reclaims for s in chunk],
            }).fetchall()
            for n, job_id in rows:
                ids[job_id] = chunk[n - 1].mix
    return ids


def states(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM pgfence.jobs WHERE queue = %s GROUP BY status",
                        (queue,)).fetchall()
    return {status: n for status, n in rows}


def _dicts(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    names = [c.name for c in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def jobs(conn: psycopg.Connection, queue: str) -> list[dict[str, Any]]:
    return _dicts(conn.execute(
        "SELECT id, kind, status, attempt, reclaims, last_error, created_at, run_at, started_at, finished_at "
        "FROM pgfence.jobs WHERE queue = %s ORDER BY id", (queue,)))


def rows_by_job(conn: psycopg.Connection, queue: str, table: str) -> dict[int, list[dict[str, Any]]]:
    """The run's rows of pgfence.effects or pgfence.receipts, per job, in
    commit order."""
    extra = {"effects": "t.worker", "receipts": "t.sent_status"}[table]
    out: dict[int, list[dict[str, Any]]] = {}
    for row in _dicts(conn.execute(
            f"SELECT t.job_id, t.id, t.attempt, {extra} FROM pgfence.{table} t "
            "JOIN pgfence.jobs j ON j.id = t.job_id WHERE j.queue = %s ORDER BY t.job_id, t.id", (queue,))):
        out.setdefault(row["job_id"], []).append(row)
    return out


def cancel_leftovers(conn: psycopg.Connection, queue: str) -> int:
    """Cancel the run's jobs still queued or running once its supervisors are
    gone (an interrupted or timed-out run), so none is left behind."""
    return conn.execute(
        "UPDATE pgfence.jobs SET status = 'cancelled', finished_at = now(), locked_by = NULL, lease_until = NULL, "
        "last_error = 'cancelled: the load test ended before this job' "
        "WHERE queue = %s AND status IN ('queued', 'running')", (queue,)).rowcount
