"""The producer's statements (``enqueue_one``, ``enqueue_default``,
``enqueue_many`` and ``enqueue_many_alike`` in ``sql/queries/client.sql``):
what :mod:`pgfence.producer` sends on a caller's connection, synchronous or
asynchronous, in the caller's transaction.

One parameter set (:class:`EnqueueParams`) serves both connection types, so
``enqueue`` and ``aenqueue`` send the same statement with the same values.
Like :mod:`pgfence.store.jobs`, the functions neither translate driver
errors nor retry: the producer wraps them in :func:`db.translated`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, LiteralString, NamedTuple, NotRequired, TypeAlias, TypedDict

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
    #: The key a per-key concurrency limit counts the job under (absent or
    #: None: none).
    concurrency_key: NotRequired[str | None]


def _job_id(row: tuple[Any, ...] | None) -> int:
    if row is None:   # a SELECT of one function call always returns its row
        raise AssertionError("enqueue returned no row")
    job_id: int = row[0]
    return job_id


def _one(p: EnqueueParams) -> tuple[LiteralString, tuple[Any, ...]]:
    """The one-job statement for ``p`` and its parameters, by position:
    ``enqueue_default`` when every option but the queue is at its
    default, else ``enqueue_one``."""
    if (p["priority"] == 0 and p["run_at"] is None and not p["delay"] and p["max_attempts"] is None
            and p["dedupe_key"] is None and p["max_reclaims"] is None and p.get("concurrency_key") is None):
        return q("enqueue_default"), (p["kind"], p["payload"], p["queue"])
    return q("enqueue_one"), (p["kind"], p["payload"], p["queue"], p["priority"], p["run_at"], p["delay"],
                              p["max_attempts"], p["dedupe_key"], p["max_reclaims"], p.get("concurrency_key"))


def enqueue(conn: psycopg.Connection[Any], params: EnqueueParams) -> int:
    """Enqueue one job in the caller's transaction; its id."""
    return _job_id(conn.execute(*_one(params)).fetchone())


async def aenqueue(aconn: psycopg.AsyncConnection[Any], params: EnqueueParams) -> int:
    """:func:`enqueue` on an asynchronous connection."""
    cursor = await aconn.execute(*_one(params))
    return _job_id(await cursor.fetchone())


#: Jobs per statement of :func:`enqueue_many`.
MANY_CHUNK = 10_000

#: One job of :func:`enqueue_many`, checked, its payload apart: kind,
#: queue, priority, run_at, delay, max_attempts, max_reclaims, dedupe_key,
#: concurrency_key (a None queue, max_attempts or max_reclaims: the kind's
#: option).
ManyRow: TypeAlias = tuple[str, str | None, int, datetime.datetime | None, float, int | None, int | None, str | None,
                           str | None]


def enqueue_many(conn: psycopg.Connection[Any], rows: Sequence[ManyRow], payloads: Sequence[str],
                 single: Callable[[int], EnqueueParams]) -> list[int]:
    """Enqueue ``rows`` in the caller's transaction, one statement per
    :data:`MANY_CHUNK`; their ids in order.  ``payloads`` holds one JSON
    array per statement, element n being the payload of the statement's
    job n.  A job the statement did not insert (its dedupe key is held)
    gets the id of the job of the same call that holds the key, else that
    of the live holder, found by enqueue's own statement with the job's
    parameters, ``single(index)`` (one round trip for each such job: the
    look-up and its retry, should the holder finish meanwhile, are
    pgfence.enqueue()'s)."""
    ids: list[int] = []
    taken: dict[tuple[str, str], int] = {}
    for chunk_no, start in enumerate(range(0, len(rows), MANY_CHUNK)):
        chunk = rows[start:start + MANY_CHUNK]
        statement, params, keys = _many_params(chunk, payloads[chunk_no])
        row = conn.execute(statement, params).fetchone()
        if row is None:   # an aggregate's one row
            raise AssertionError("enqueue_many returned no row")
        got = _ids(row[0], len(chunk))
        if len(got) != len(chunk):
            raise AssertionError(f"enqueue_many returned {len(got)} ids for {len(chunk)} jobs")
        if keys.count(None) != len(keys):
            inserted = set(_ints(row[1] or "{}"))
            for n, key in enumerate(keys):
                if key is None:
                    continue
                kind = chunk[n][0]
                if got[n] not in inserted:
                    holder = taken.get((kind, key))
                    got[n] = holder if holder is not None else enqueue(conn, single(start + n))
                taken.setdefault((kind, key), got[n])
        ids.extend(got)
    return ids


def _ints(text: str) -> list[int]:
    """The elements of a bigint[] array's text, ``{1,2,3}``."""
    return [int(v) for v in text[1:-1].split(",")] if len(text) > 2 else []


def _ids(text: str, n: int) -> list[int]:
    """The ids of the statement's ``n`` jobs, in order: the first of ``n``
    consecutive ones, or the text of the array of them."""
    return _ints(text) if text.startswith("{") else list(range(int(text), int(text) + n))


def _many_params(chunk: Sequence[ManyRow],
                 payloads: str) -> tuple[LiteralString, dict[str, Any], tuple[str | None, ...]]:
    """The statement for ``chunk``, its parameters, and the chunk's dedupe
    keys.  A chunk whose jobs differ in their payloads alone goes by
    ``enqueue_many_alike``, with each column's one value.  Any other goes
    by ``enqueue_many``: each column as one array literal (psycopg adapts a
    list element by element, which was most of the Python time of a
    batch), NULL for a column at its default in every job (unnest pads a
    missing array with NULLs), and one kind alone when every job has it.
    Names are checked, so they need quotes but no escapes; the few run_at
    values go as a list, for psycopg to write."""
    n = len(chunk)
    columns = tuple(zip(*chunk, strict=True))
    kinds, queues, priorities, run_ats, delays, max_attempts, max_reclaims, keys, concurrency_keys = columns
    if (all(c.count(c[0]) == n for c in columns) and run_ats[0] is None and keys[0] is None
            and concurrency_keys[0] is None):
        return q("enqueue_many_alike"), {
            "payloads": payloads, "kind": kinds[0], "queue": queues[0], "priority": priorities[0],
            "delay": delays[0], "max_attempts": max_attempts[0], "max_reclaims": max_reclaims[0]}, keys
    one_kind = kinds.count(kinds[0]) == n
    return q("enqueue_many"), {
        "kind": kinds[0] if one_kind else None,
        "kinds": None if one_kind else '{"' + '","'.join(kinds) + '"}',
        "payloads": payloads,
        "queues": None if queues.count(None) == n else
        "{" + ",".join("NULL" if v is None else '"' + v + '"' for v in queues) + "}",
        "priorities": None if priorities.count(0) == n else "{" + ",".join(map(int.__repr__, priorities)) + "}",
        "run_ats": None if run_ats.count(None) == n else list(run_ats),
        "delays": None if delays.count(0.0) == n else "{" + ",".join(map(float.__repr__, delays)) + "}",
        "max_attempts": _int_array(max_attempts, n),
        "max_reclaims": _int_array(max_reclaims, n),
        "dedupe_keys": None if keys.count(None) == n else "{" + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in keys) + "}",
        # A key holds no control character (the column's check); a list,
        # for psycopg to write, since it may hold any other.
        "concurrency_keys": None if concurrency_keys.count(None) == n else list(concurrency_keys),
    }, keys


def _int_array(values: tuple[int | None, ...], n: int) -> str | None:
    if values.count(None) == n:
        return None
    return "{" + ",".join("NULL" if v is None else int.__repr__(v) for v in values) + "}"


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
