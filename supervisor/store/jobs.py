"""The job statements of the worker and of the heartbeat manager
(``sql/queries/jobs.sql``): one function per named query, typed parameters,
typed rows.

Every owner write (complete, batched complete, fail-or-retry, release,
put-back) is issued from its function here and nowhere else, fenced by
``(id, attempt)``, so its policy cannot differ between callers: the retry
backoff is computed in :func:`fail_or_retry`, and the released, retried and
failed counters are bumped next to the write that earned them.

The functions run the statement and shape its rows; they neither translate
driver errors nor retry (the caller wraps them in :func:`db.translated` or
:func:`db.retrying`, which knows the DSN to scrub and what the statement is
called in a log line).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import psycopg

from pgfence.backoff import Backoff
from pgfence.store import db
from pgfence.store.queries import q

# _metrics_later: the counters are imported where they are bumped, not at the
# top: the producer's enqueue lives here too, and `pgfence run` must set up
# Prometheus's multiprocess directory before anything imports
# prometheus_client (see observe/multiproc.prepare).


class Claimed(NamedTuple):
    """One row of ``claim``: a job this worker now runs, or a reclaim past
    its budget that the claim turned failed (``status == "failed"``)."""

    id: int
    queue: str
    kind: str
    #: The payload as JSON text, decoded only if the handler reads it.
    payload: str
    status: str
    attempt: int
    max_attempts: int
    reclaims: int
    max_reclaims: int
    priority: int
    dedupe_key: str | None
    created_at: datetime.datetime
    run_at: datetime.datetime
    last_error: str | None
    #: "queued" for a first claim, "running" for a reclaim.
    prev_status: str


def _claim_order(row: Claimed) -> tuple[int, datetime.datetime, int]:
    return -row.priority, row.run_at, row.id


def claim(conn: psycopg.Connection, *, queues: Sequence[str], batch: int, worker: str, lease: float,
          lease_kinds: list[str], lease_secs: list[float], reclaim: bool,
          kinds: list[str] | None = None, not_kinds: list[str] | None = None) -> list[Claimed]:
    """Claim up to ``batch`` jobs of ``queues`` for ``worker``, in claim order
    (priority DESC, run_at, id).  ``lease_kinds``/``lease_secs`` give the
    lease of the kinds that have their own; ``reclaim`` also takes running
    jobs whose lease ran out; ``kinds`` (None: any kind) limits the claim
    to those kinds, ``not_kinds`` (None: none) to the other kinds."""
    params = _claim_params(queues, batch, worker, lease, lease_kinds, lease_secs, reclaim, kinds, not_kinds)
    return _claimed(conn.execute(q("claim"), params).fetchall())


async def claim_async(conn: psycopg.AsyncConnection, *, queues: Sequence[str], batch: int, worker: str,
                      lease: float, lease_kinds: list[str], lease_secs: list[float], reclaim: bool,
                      kinds: list[str] | None = None, not_kinds: list[str] | None = None) -> list[Claimed]:
    """:func:`claim` on an async connection (the claims a worker's event
    loop makes for itself)."""
    params = _claim_params(queues, batch, worker, lease, lease_kinds, lease_secs, reclaim, kinds, not_kinds)
    cursor = await conn.execute(q("claim"), params)
    return _claimed(await cursor.fetchall())


def _claim_params(queues: Sequence[str], batch: int, worker: str, lease: float, lease_kinds: list[str],
                  lease_secs: list[float], reclaim: bool, kinds: list[str] | None,
                  not_kinds: list[str] | None) -> dict[str, object]:
    # The arrays go as literals: psycopg adapts a list element by element,
    # which cost a one-job worker more than its claim's other parameters.
    return {"queues": db.text_array_literal(queues), "batch": batch, "worker": worker, "lease": lease,
            "lease_kinds": db.text_array_literal(lease_kinds), "lease_secs": db.array_literal(lease_secs),
            "reclaim": reclaim, "kinds": None if kinds is None else db.text_array_literal(kinds),
            "not_kinds": None if not_kinds is None else db.text_array_literal(not_kinds)}


def _claimed(fetched: list[tuple[object, ...]]) -> list[Claimed]:
    make = Claimed._make
    rows = [make(row) for row in fetched]
    # UPDATE ... RETURNING has no guaranteed order: the batch runs in the
    # claim's order whatever the plan.
    rows.sort(key=_claim_order)
    return rows


def complete(conn: psycopg.Connection, job_id: int, attempt: int, result: str | None = None) -> bool:
    """Fenced completion, in the caller's transaction, storing ``result``
    (JSON text; None: none); False when this attempt no longer owns the job
    (the caller must roll back)."""
    params = {"id": job_id, "attempt": attempt, "result": result}
    return conn.execute(q("complete"), params).fetchone() is not None


async def complete_async(conn: psycopg.AsyncConnection, job_id: int, attempt: int,
                         result: str | None = None) -> bool:
    """:func:`complete` on an async connection (an async handler's
    ``fenced()`` block), in the caller's transaction."""
    cursor = await conn.execute(q("complete"), {"id": job_id, "attempt": attempt, "result": result})
    return await cursor.fetchone() is not None


def store_result(conn: psycopg.Connection, job_id: int, attempt: int, result: str) -> bool:
    """Store the result of a job that ``attempt`` completed already (its
    handler's fenced block did); False when no such done row is found."""
    params = {"id": job_id, "attempt": attempt, "result": result}
    return conn.execute(q("store_result"), params).rowcount == 1


async def store_result_async(conn: psycopg.AsyncConnection, job_id: int, attempt: int, result: str) -> bool:
    """:func:`store_result` on an async connection."""
    cursor = await conn.execute(q("store_result"), {"id": job_id, "attempt": attempt, "result": result})
    return cursor.rowcount == 1


async def complete_unfenced_async(conn: psycopg.AsyncConnection, job_id: int) -> bool:
    """:func:`complete_unfenced` on an async connection."""
    cursor = await conn.execute(q("complete_unfenced"), {"id": job_id})
    return await cursor.fetchone() is not None


def complete_unfenced(conn: psycopg.Connection, job_id: int) -> bool:
    """UNSAFE completion by id alone (the demo's unprotected mode)."""
    return conn.execute(q("complete_unfenced"), {"id": job_id}).fetchone() is not None


def raising_completion(job_id: int, attempt: int, *, fence: bool = True) -> tuple[str, dict[str, int]]:
    """The completion statement of a block sent in one round trip (a
    pipeline, or ``fenced_writes``), to be queued after the block's own
    statements: ``complete_or_raise`` raises SQLSTATE PF001 (see
    :func:`db.fence_refused`) when the fence refuses, which aborts the
    COMMIT queued behind it.  With ``fence`` False, ``complete_unfenced``."""
    if fence:
        return q("complete_or_raise"), {"id": job_id, "attempt": attempt}
    return q("complete_unfenced"), {"id": job_id}


def complete_many(conn: psycopg.Connection, ids: Sequence[int], attempts: Sequence[int],
                  results: Sequence[str | None] | None = None) -> set[int]:
    """Fenced completion of many jobs in one statement, each by its own
    ``(id, attempt)``, storing each one's result (``results``, by position;
    None: none); returns the ids that were still owned.  One job (a one-job
    worker's every completion) goes as ``complete``, a primary key look-up,
    instead of the batch's unnest, join, sort and lock step, which cost its
    backend several times as much CPU."""
    if len(ids) == 1:
        return {ids[0]} if complete(conn, ids[0], attempts[0], results[0] if results else None) else set()
    return {job_id for (job_id,) in conn.execute(q("complete_many"), _many_params(ids, attempts, results))}


async def complete_many_async(conn: psycopg.AsyncConnection, ids: Iterable[int], attempts: Iterable[int],
                              results: Sequence[str | None] | None = None) -> set[int]:
    """:func:`complete_many` on an async connection."""
    cursor = await conn.execute(q("complete_many"), _many_params(ids, attempts, results))
    return {job_id for (job_id,) in await cursor.fetchall()}


def _many_params(ids: Iterable[int], attempts: Iterable[int],
                 results: Sequence[str | None] | None) -> dict[str, object]:
    # No result at all (the common case): a NULL array, which unnest pads
    # with NULLs, so the statement is sent as it was before results.
    stored = list(results) if results is not None and any(r is not None for r in results) else None
    return {"ids": db.array_literal(ids), "attempts": db.array_literal(attempts), "results": stored}


class Reported(NamedTuple):
    """What ``fail_or_retry`` did to a job it still owned."""

    #: "queued" (retried after ``delay``) or "failed" (for good).
    status: str
    queue: str
    kind: str
    #: Attempts spent (put-backs spent none).
    spent: int
    max_attempts: int
    #: Seconds until the retry may run (meaningless once failed).
    delay: float


#: The outcomes of an attempt recorded in pgfence.job_attempts (migration 0012).
ATTEMPT_OUTCOMES = ("error", "lease_lost", "fence_rejected", "released", "cancelled", "timeout")


def fail_or_retry(conn: psycopg.Connection, job_id: int, attempt: int, *, error: str, traceback: str | None,
                  final: bool, backoff: Backoff, outcome: str = "error") -> Reported | None:
    """Fenced error report: the job goes back to the queue after the
    ``backoff`` delay of ``attempt``, or fails once its attempts are spent
    (or with ``final``), and the attempt is recorded in pgfence.job_attempts
    (``outcome``: "error" or "timeout", with ``error`` as its detail).
    Counts it retried or failed.  None when this attempt no longer owns the
    job: nothing was written."""
    if outcome not in ("error", "timeout"):
        raise ValueError(f"fail_or_retry records an error or a timeout, not {outcome!r}")
    delay = backoff.delay(attempt)
    row = conn.execute(q("fail_or_retry"), {"id": job_id, "attempt": attempt, "error": error,
                                            "traceback": traceback, "final": final, "backoff": delay,
                                            "outcome": outcome}).fetchone()
    if row is None:
        return None
    status, queue, kind, spent, max_attempts = row
    from pgfence.observe import metrics   # see _metrics_later
    counter = metrics.JOBS_FAILED if status == "failed" else metrics.JOBS_RETRIED
    counter.labels(queue, kind).inc()
    return Reported(status, queue, kind, spent, max_attempts, delay)


def put_back_unknown(conn: psycopg.Connection, job_id: int, attempt: int, *, delay: float, give_up: float,
                     error: str) -> str | None:
    """Fenced put-back of a job of a kind this worker does not know; the
    job's new status ("queued", or "failed" once it is ``give_up`` seconds
    old), or None when this attempt no longer owns it."""
    row = conn.execute(q("put_back_unknown"), {"id": job_id, "attempt": attempt, "delay": delay,
                                               "give_up": give_up, "error": error}).fetchone()
    if row is None:
        return None
    (status,) = row
    status_text: str = status
    return status_text


def rate_limited(conn: psycopg.Connection, job_id: int, attempt: int, *, delay: float, detail: str) -> bool:
    """Fenced put-back of a job whose handler was rate limited: queued again
    ``delay`` seconds later, no attempt spent, its kind's rate closed until
    then; False when this attempt no longer owns it."""
    params = {"id": job_id, "attempt": attempt, "delay": delay, "detail": detail}
    return conn.execute(q("rate_limited"), params).fetchone() is not None


class Released(NamedTuple):
    """A job handed back to the queue by :func:`release`."""

    id: int
    queue: str
    kind: str


def release(conn: psycopg.Connection, job_id: int, attempt: int, *, reclaim: bool = False,
            reason: str | None = None, detail: str | None = None) -> Released | None:
    """Fenced release: the job goes back to the queue at once (``reclaim``
    counts it against its reclaim budget, ``reason`` becomes its last
    error), and the attempt is recorded in pgfence.job_attempts as released
    (``detail``, else ``reason``, else "released", saying why).  Counts it
    released.  None when this attempt no longer owns it."""
    row = conn.execute(q("release"), {"id": job_id, "attempt": attempt, "reclaim": reclaim, "reason": reason,
                                      "detail": detail or reason or "released"}).fetchone()
    if row is None:
        return None
    released = Released._make(row)
    from pgfence.observe import metrics   # see _metrics_later
    metrics.JOBS_RELEASED.labels(released.queue, released.kind).inc()
    return released


#: What the fence refused, as note_fence_rejected's detail names it.
REFUSED_WRITES = ("completion", "error report", "put-back")


def note_fence_rejected(conn: psycopg.Connection, ids: Sequence[int], attempts: Sequence[int],
                        ran: Sequence[float], *, worker: str, what: str = "completion") -> None:
    """Record in pgfence.job_attempts the attempts of ``worker`` whose
    ``what`` (one of REFUSED_WRITES) the fence refused (``ran``: seconds
    since each started), in one statement."""
    if what not in REFUSED_WRITES:
        raise ValueError(f"unknown refused write {what!r}")
    if ids:
        conn.execute(q("note_fence_rejected"), {
            "ids": db.array_literal(ids), "attempts": db.array_literal(attempts),
            "ran": db.array_literal([max(0.0, r) for r in ran]), "worker": worker, "what": what})


def _seconds(conn: psycopg.Connection, name: str, queues: Sequence[str]) -> float | None:
    row = conn.execute(q(name), {"queues": list(queues)}).fetchone()
    if row is None:
        return None
    (seconds,) = row
    value: float | None = seconds
    return value


def next_run_at(conn: psycopg.Connection, queues: Sequence[str]) -> float | None:
    """Seconds until the earliest run_at still to come among the queued jobs
    of ``queues``; None if there is none."""
    return _seconds(conn, "next_run_at", queues)


def next_lease_end(conn: psycopg.Connection, queues: Sequence[str]) -> float | None:
    """Seconds until the earliest lease still to run out among the running
    jobs of ``queues``; None if there is none."""
    return _seconds(conn, "next_lease_end", queues)


class Owned(NamedTuple):
    """A running job and the attempt that holds it."""

    id: int
    attempt: int


def owned_running(conn: psycopg.Connection, owner: str) -> list[Owned]:
    """The running jobs claimed under the worker name ``owner``."""
    return [Owned._make(row) for row in conn.execute(q("owned_running"), {"owner": owner})]


def still_owned(conn: psycopg.Connection, job_id: int, attempt: int) -> bool:
    """Whether ``attempt`` still owns the job (running, same attempt)."""
    row = conn.execute(q("still_owned"), {"id": job_id, "attempt": attempt}).fetchone()
    return row is not None and bool(row[0])

