"""Enqueue from Python, inside the caller's own transaction.

::

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        enqueue(conn, "send_receipt", {"order_id": 42})

    async with aconn.transaction():          # a psycopg.AsyncConnection
        await aconn.execute("INSERT INTO orders ...")
        await aenqueue(aconn, "send_receipt", {"order_id": 42})

The job is committed with the caller's write or rolled back with it.  The SQL
function ``pgfence.enqueue(...)`` does the same for producers in any language.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import psycopg

from pgfence.scheduling.schedule import TICK_KEY_PREFIX
from pgfence.store import db
from pgfence import names
from pgfence import registry
from pgfence import limits
from pgfence.errors import ConfigError
from pgfence.results import has_nul
from pgfence.store import client

_INT4_MIN, _INT4_MAX = -(2**31), 2**31 - 1

#: A value ``json.dumps`` can write: what a job's payload may be.  Mapping and
#: Sequence rather than dict and list, because they are covariant: a
#: ``dict[str, int]`` is a JSON object, while it is not a ``dict[str, JSON]``.
JSON: TypeAlias = Mapping[str, "JSON"] | Sequence["JSON"] | str | int | float | bool | None


def enqueue(
    conn: psycopg.Connection[Any],
    kind: str,
    payload: JSON = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    max_reclaims: int | None = None,
    dedupe_key: str | None = None,
    concurrency_key: str | None = None,
) -> int:
    """Enqueue one job on ``conn`` and return its id.

    ``queue``, ``max_attempts`` and ``max_reclaims`` default to the options of
    the kind's handler when it is registered in this process; otherwise to
    those a worker recorded in ``pgfence.kinds`` (applied by the database),
    else to ``default``, 5 and 3.  An explicit value always wins.  With a
    ``dedupe_key`` the id of the live (queued or running) job holding that key
    is returned instead of a new one.  A ``concurrency_key`` (at most 200
    characters, no control character) is what the kind's
    ``per_key_concurrency`` counts the job under.  Bad input raises
    :class:`ConfigError` before anything is sent.
    """
    params = _params(kind, payload, queue=queue, priority=priority, run_at=run_at, delay=delay,
                     max_attempts=max_attempts, max_reclaims=max_reclaims, dedupe_key=dedupe_key,
                     concurrency_key=concurrency_key)
    with db.translated():
        return client.enqueue(conn, params)


async def aenqueue(
    aconn: psycopg.AsyncConnection[Any],
    kind: str,
    payload: JSON = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    max_reclaims: int | None = None,
    dedupe_key: str | None = None,
    concurrency_key: str | None = None,
) -> int:
    """:func:`enqueue` on a ``psycopg.AsyncConnection``: the same options,
    defaults and errors, in the caller's transaction."""
    params = _params(kind, payload, queue=queue, priority=priority, run_at=run_at, delay=delay,
                     max_attempts=max_attempts, max_reclaims=max_reclaims, dedupe_key=dedupe_key,
                     concurrency_key=concurrency_key)
    with db.translated():
        return await client.aenqueue(aconn, params)


#: The fields a job of :func:`enqueue_many` may give: enqueue's arguments.
FIELDS = frozenset({"kind", "payload", "queue", "priority", "run_at", "delay", "max_attempts", "max_reclaims",
                    "dedupe_key", "concurrency_key"})


def enqueue_many(conn: psycopg.Connection[Any], jobs: Iterable[Mapping[str, Any]]) -> list[int]:
    """Enqueue many jobs on ``conn`` in the caller's transaction; their ids,
    in the order given.

    Each job is a mapping of :func:`enqueue`'s arguments by name
    (``{"kind": "send_receipt", "payload": {...}, "queue": "mail"}``;
    ``kind`` is required), with the same defaults.  The jobs go in one
    statement per ``client.MANY_CHUNK`` (10,000) jobs, not one per job.  A
    job whose dedupe key a live job of its kind holds (or an earlier job of
    the same call) gets that job's id, as with :func:`enqueue`.  Bad input
    raises :class:`ConfigError` naming the job (``job 3: invalid delay:
    ...``) before anything is sent.
    """
    rows: list[client.ManyRow] = []
    payloads: list[JSON] = []
    kinds: dict[str, registry.HandlerSpec | None] = {}
    queues: set[str] = set()
    for n, job in enumerate(jobs):
        # The common job (a dict of kind, payload and maybe queue, priority
        # and dedupe key, names seen before in the call) is checked here in
        # a few operations; any other, or any doubt, by _params itself.
        row = _quick(job, kinds, queues) if type(job) is dict and job.keys() <= _QUICK else None
        if row is None:
            try:
                row = _row(_checked(job))
            except ConfigError as exc:
                _check_payloads(payloads)     # an earlier job's payload is named first
                raise ConfigError(f"job {n}: {exc}") from None
        rows.append(row)
        payload = job.get("payload")
        payloads.append(payload if payload is not None else {})
    # The payloads of a statement as one JSON array, encoded at once (a
    # third of the time of encoding each apart); a payload that cannot be
    # is found and named by _check_payloads.
    texts = []
    for start in range(0, len(payloads), client.MANY_CHUNK):
        chunk = payloads[start:start + client.MANY_CHUNK]
        try:
            text = _ENCODE(chunk)
        except (TypeError, ValueError) as exc:
            _check_payloads(chunk, start)
            raise ConfigError(f"payload is not JSON-serialisable: {exc}") from None
        if "\\u0000" in text:
            _check_payloads(chunk, start)
        texts.append(text)

    def single(n: int) -> client.EnqueueParams:
        return _params_of(rows[n], _payload_text(payloads[n]))

    with db.translated():
        return client.enqueue_many(conn, rows, texts, single)


#: The fields :func:`_quick` checks itself.
_QUICK = frozenset({"kind", "payload", "queue", "priority", "dedupe_key"})
_UNSEEN = object()


def _quick(job: dict[str, Any], kinds: dict[str, registry.HandlerSpec | None],
           queues: set[str]) -> client.ManyRow | None:
    """The row of a job of kind, payload, queue, priority and dedupe key
    alone, with its kind's registered options (``kinds`` and ``queues``:
    the names the call checked so far); None for _params to check it, when
    anything is not plainly valid.  Its payload is checked with the
    statement's."""
    kind = job.get("kind")
    if kind.__class__ is not str:
        return None
    spec = kinds.get(kind, _UNSEEN)
    if spec is _UNSEEN:
        if names.problem(kind, "kind"):
            return None
        spec = kinds[kind] = registry.find(kind)
    priority = job.get("priority", 0)
    if priority.__class__ is not int or not _INT4_MIN <= priority <= _INT4_MAX:
        return None
    queue = job.get("queue")
    if queue is not None:
        if queue.__class__ is not str:
            return None
        if queue not in queues:
            if names.problem(queue, "queue"):
                return None
            queues.add(queue)
    key = job.get("dedupe_key")
    if key is not None and (key.__class__ is not str or key.startswith(TICK_KEY_PREFIX)):
        return None
    if spec is None:
        return (kind, queue, priority, None, 0.0, None, None, key, None)
    assert isinstance(spec, registry.HandlerSpec)
    return (kind, queue or spec.queue, priority, None, 0.0, spec.max_attempts, spec.max_reclaims, key, None)


def _checked(job: object) -> client.EnqueueParams:
    """One job of :func:`enqueue_many` checked in full; ConfigError."""
    if not isinstance(job, Mapping):
        raise ConfigError(f"must be a mapping of enqueue's arguments, got {type(job).__name__}")
    unknown = job.keys() - FIELDS
    if unknown:
        raise ConfigError(f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    if "kind" not in job:
        raise ConfigError("no kind")
    return _params(job["kind"], job.get("payload"), queue=job.get("queue"), priority=job.get("priority", 0),
                   run_at=job.get("run_at"), delay=job.get("delay"), max_attempts=job.get("max_attempts"),
                   max_reclaims=job.get("max_reclaims"), dedupe_key=job.get("dedupe_key"),
                   concurrency_key=job.get("concurrency_key"))


def _row(p: client.EnqueueParams) -> client.ManyRow:
    return (p["kind"], p["queue"], p["priority"], p["run_at"], p["delay"], p["max_attempts"], p["max_reclaims"],
            p["dedupe_key"], p.get("concurrency_key"))


def _params_of(row: client.ManyRow, payload: str) -> client.EnqueueParams:
    kind, queue, priority, run_at, delay, max_attempts, max_reclaims, dedupe_key, concurrency_key = row
    return {"kind": kind, "payload": payload, "queue": queue, "priority": priority, "run_at": run_at, "delay": delay,
            "max_attempts": max_attempts, "dedupe_key": dedupe_key, "max_reclaims": max_reclaims,
            "concurrency_key": concurrency_key}


def _check_payloads(payloads: Sequence[JSON], first: int = 0) -> None:
    """ConfigError naming the first of ``payloads`` (job ``first`` on) that
    is no payload."""
    for n, payload in enumerate(payloads, first):
        try:
            _payload_text(payload)
        except ConfigError as exc:
            raise ConfigError(f"job {n}: {exc}") from None


def _params(kind: str, payload: JSON, *, queue: str | None, priority: int, run_at: dt.datetime | None,
            delay: float | None, max_attempts: int | None, max_reclaims: int | None,
            dedupe_key: str | None, concurrency_key: str | None = None) -> client.EnqueueParams:
    """One job's checked statement parameters, its kind's registered
    options applied; :class:`ConfigError` on bad input."""
    names.check(kind, "kind")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ConfigError(f"invalid priority: must be a whole number, got {priority!r}")
    if queue is not None:
        names.check(queue, "queue")
    if dedupe_key is not None and not isinstance(dedupe_key, str):
        raise ConfigError(f"invalid dedupe key: must be a string, got {dedupe_key!r}")
    if dedupe_key is not None and dedupe_key.startswith(TICK_KEY_PREFIX):
        raise ConfigError(f"invalid dedupe key: {TICK_KEY_PREFIX!r} is reserved for the jobs of schedules")
    if delay is not None and (not isinstance(delay, int | float) or isinstance(delay, bool)):
        raise ConfigError(f"invalid delay: must be a number of seconds, got {delay!r}")
    if run_at is not None and not isinstance(run_at, dt.datetime):
        raise ConfigError(f"invalid run_at: must be a datetime, got {run_at!r}")
    if delay is not None and run_at is not None:
        raise ConfigError("give delay or run_at, not both")
    if delay is not None and delay < 0:
        raise ConfigError(f"invalid delay: must be 0 or more seconds, got {delay}")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigError(f"invalid max-attempts: must be at least 1, got {max_attempts}")
    if max_reclaims is not None and max_reclaims < 0:
        raise ConfigError(f"invalid max-reclaims: must be 0 or more, got {max_reclaims}")
    limits.check_key(concurrency_key)
    # The columns are 32-bit integers; a larger Python int would be sent as a
    # bigint, for which no pgfence.enqueue(...) signature exists.
    for name, value in (("priority", priority), ("max-attempts", max_attempts), ("max-reclaims", max_reclaims)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"invalid {name}: must be a whole number, got {value!r}")
        if value is not None and not _INT4_MIN <= value <= _INT4_MAX:
            raise ConfigError(f"invalid {name}: must be between {_INT4_MIN} and {_INT4_MAX}, got {value}")
    text = _payload_text(payload)
    spec = registry.find(kind)
    if spec is not None:
        queue = queue or spec.queue
        max_attempts = max_attempts if max_attempts is not None else spec.max_attempts
        max_reclaims = max_reclaims if max_reclaims is not None else spec.max_reclaims
    return {
        "kind": kind,
        "payload": text,
        "queue": queue or None,   # None: the database applies the kind's queue
        "priority": priority,
        "run_at": run_at,
        "delay": float(delay or 0.0),
        "max_attempts": max_attempts,
        "dedupe_key": dedupe_key,
        "max_reclaims": max_reclaims,
        "concurrency_key": concurrency_key,
    }


#: ``json.dumps(value, allow_nan=False)``, its encoder made once.
_ENCODE = json.JSONEncoder(allow_nan=False).encode


def _payload_text(payload: JSON) -> str:
    """A payload's JSON text ({} for None); ConfigError when it has none."""
    try:
        text = _ENCODE(payload if payload is not None else {})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"payload is not JSON-serialisable: {exc}") from None
    # json.dumps writes NUL as \\u0000; the walk tells it from an escaped backslash.
    if "\\u0000" in text and has_nul(payload):
        raise ConfigError("invalid payload: a string holds a NUL character (\\u0000), which jsonb cannot store")
    return text
