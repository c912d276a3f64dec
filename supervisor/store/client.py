"""The producer's statements (``enqueue`` in ``sql/queries/jobs.sql``,
``enqueue_many`` in ``sql/queries/client.sql``): what
:mod:`pgfence.producer` sends on a caller's connection, synchronous or
asynchronous, in the caller's transaction.

One parameter set (:class:`EnqueueParams`) serves both connection types, so
``enqueue`` and ``aenqueue`` send the same statement with the same values.
Like :mod:`pgfence.store.jobs`, the functions neither translate driver
errors nor retry: the producer wraps them in :func:`db.translated`.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, NamedTuple, TypedDict

import psycopg

from pgfence.store import web
from pgfence.store.queries import q


class EnqueueParams(TypedDict):
    """The ``enqueue`` statement's parameters.  A None queue, max_attempts
    or max_reclaims takes the kind's registered option (the database
    applies it)."""

    kind: str
    #: The payload as JSON text.
    payload: str
    queue: str | None
    priority: int
    run_at: datetime.datetime | None
    delay: float
    max_attempts: int | None
    dedupe_key: str | None
    max_reclaims: int | None


def _job_id(row: tuple[Any, ...] | None) -> int:
    if row is None:   # a SELECT of one function call always returns its row
        raise AssertionError("enqueue returned no row")
    job_id: int = row[0]
    return job_id


def enqueue(conn: psycopg.Connection[Any], params: EnqueueParams) -> int:
    """Enqueue one job in the caller's transaction; its id."""
    return _job_id(conn.execute(q("enqueue"), dict(params)).fetchone())


async def aenqueue(aconn: psycopg.AsyncConnection[Any], params: EnqueueParams) -> int:
    """:func:`enqueue` on an asynchronous connection."""
    cursor = await aconn.execute(q("enqueue"), dict(params))
    return _job_id(await cursor.fetchone())


#: Jobs per statement of :func:`enqueue_many`.
MANY_CHUNK = 10_000

#: The ``enqueue_many`` statement's arrays, by the parameter each fills.
_COLUMNS = (("kinds", "kind"), ("payloads", "payload"), ("queues", "queue"), ("priorities", "priority"),
            ("run_ats", "run_at"), ("delays", "delay"), ("max_attempts", "max_attempts"),
            ("max_reclaims", "max_reclaims"), ("dedupe_keys", "dedupe_key"))


def enqueue_many(conn: psycopg.Connection[Any], jobs: Sequence[EnqueueParams]) -> list[int]:
    """Enqueue ``jobs`` in the caller's transaction, one statement per
    :data:`MANY_CHUNK`; their ids in order.  A job the statement did not
    insert (its dedupe key is held) gets the id of the job of the same call
    that holds the key, else that of the live holder, found by enqueue's own
    statement (one round trip for each such job: the look-up and its retry,
    should the holder finish meanwhile, are pgfence.enqueue()'s)."""
    ids: list[int] = []
    taken: dict[tuple[str, str], int] = {}
    for start in range(0, len(jobs), MANY_CHUNK):
        chunk = jobs[start:start + MANY_CHUNK]
        params: dict[str, list[Any]] = {name: [job[field] for job in chunk]  # type: ignore[literal-required]
                                        for name, field in _COLUMNS}
        rows = conn.execute(q("enqueue_many"), params).fetchall()
        if len(rows) != len(chunk):
            raise AssertionError(f"enqueue_many returned {len(rows)} rows for {len(chunk)} jobs")
        for job, (job_id,) in zip(chunk, rows, strict=True):
            key = job["dedupe_key"]
            if job_id is None:
                job_id = taken.get((job["kind"], key)) if key is not None else None
                if job_id is None:
                    job_id = enqueue(conn, job)
            if key is not None:
                taken.setdefault((job["kind"], key), job_id)
            ids.append(job_id)
    return ids


class FoundJob(NamedTuple):
    """A job's row and its recorded attempts' rows."""

    job: web.JobDetail
    attempts: list[web.AttemptRow]


def get_job(conn: psycopg.Connection[Any], job_id: int) -> FoundJob | None:
    """The job ``job_id`` wherever it is (the dashboard's job page's
    statements), with its attempts; None when there is none."""
    row = conn.execute(q("web_job"), {"id": job_id}).fetchone()
    if row is None:
        return None
    attempts = conn.execute(q("web_job_attempts"), {"id": job_id}).fetchall()
    return FoundJob(web.JobDetail._make(row), [web.AttemptRow._make(a) for a in attempts])


async def aget_job(aconn: psycopg.AsyncConnection[Any], job_id: int) -> FoundJob | None:
    """:func:`get_job` on an asynchronous connection."""
    row = await (await aconn.execute(q("web_job"), {"id": job_id})).fetchone()
    if row is None:
        return None
    attempts = await (await aconn.execute(q("web_job_attempts"), {"id": job_id})).fetchall()
    return FoundJob(web.JobDetail._make(row), [web.AttemptRow._make(a) for a in attempts])
