"""The producer's statements (``enqueue`` in ``sql/queries/jobs.sql``): what
:mod:`pgfence.producer` sends on a caller's connection, synchronous or
asynchronous, in the caller's transaction.

One parameter set (:class:`EnqueueParams`) serves both connection types, so
``enqueue`` and ``aenqueue`` send the same statement with the same values.
Like :mod:`pgfence.store.jobs`, the functions neither translate driver
errors nor retry: the producer wraps them in :func:`db.translated`.
"""

from __future__ import annotations

import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from pgfence.store.queries import q


class EnqueueParams(TypedDict):
    """The ``enqueue`` statement's parameters.  A None queue, max_attempts
    or max_reclaims takes the kind's registered option (the database
    applies it)."""

    kind: str
    payload: Jsonb
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
