"""What the load test adds to its statements in :mod:`.statements`:
the jobs enqueued in chunks from the mix, and rows shaped as the audit reads
them (by column name).  The runner calls the store directly for the rest.
Everything is filtered by the run's queue, so other jobs in the same
database are never counted."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgfence.tools.loadtest import statements as loadtest
from pgfence.tools.loadtest.mix import JobSpec

ENQUEUE_CHUNK = 5000


def enqueue(conn: psycopg.Connection[Any], queue: str, specs: list[JobSpec]) -> dict[int, JobSpec]:
    """Enqueue every job in ONE transaction (workers see them all at once);
    return job id -> its spec."""
    ids: dict[int, JobSpec] = {}
    with conn.transaction():
        for start in range(0, len(specs), ENQUEUE_CHUNK):
            chunk = specs[start:start + ENQUEUE_CHUNK]
            rows = loadtest.enqueue_chunk(conn, queue, kinds=[s.kind for s in chunk],
                                          payloads=[Jsonb(s.payload) for s in chunk],
                                          attempts=[s.max_attempts for s in chunk],
                                          reclaims=[s.max_reclaims for s in chunk],
                                          keys=[s.concurrency_key for s in chunk])
            for row in rows:
                ids[row.id] = chunk[row.n - 1]
    return ids


def attempts(conn: psycopg.Connection[Any], ids: list[int]) -> list[dict[str, Any]]:
    """The recorded attempts of the jobs ``ids`` (pgfence.job_attempts), as
    the audit reads them (by column name)."""
    return [row._asdict() for row in loadtest.attempts(conn, ids)] if ids else []


def jobs(conn: psycopg.Connection[Any], queue: str) -> list[dict[str, Any]]:
    """Every job of the run, as the audit reads it (by column name)."""
    return [row._asdict() for row in loadtest.jobs(conn, queue)]


def rows_by_job(conn: psycopg.Connection[Any], queue: str, table: str) -> dict[int, list[dict[str, Any]]]:
    """The run's rows of pgfence_examples.effects or pgfence_examples.receipts, per job, in
    commit order."""
    rows = loadtest.effects(conn, queue) if table == "effects" else loadtest.receipts(conn, queue)
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row.job_id, []).append(row._asdict())
    return out
