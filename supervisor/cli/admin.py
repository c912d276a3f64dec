"""Operator commands: status, failed, retry, cancel.  Each returns plain
data, which the CLI prints as a table or as JSON."""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from pgfence.store import db
from pgfence.store.queries import q


def status(conn: psycopg.Connection) -> dict[str, Any]:
    """Counts per queue and status, and every running job with its lease."""
    with db.translated():
        counts: dict[str, dict[str, int]] = {}
        for queue, state, jobs in conn.execute(q("status_counts")):
            counts.setdefault(queue, {})[state] = jobs
        running = [
            {"id": r[0], "queue": r[1], "kind": r[2], "attempt": r[3], "locked_by": r[4],
             "lease_left": round(r[5], 3) if r[5] is not None else None}
            for r in conn.execute(q("running_jobs"))
        ]
    return {"queues": counts, "running": running}


class RetryResult(NamedTuple):
    """What ``retry`` did: the jobs queued again, and the jobs skipped as
    ``(id, holder)`` because the job ``holder`` holds their dedupe key."""

    requeued: list[int]
    skipped: list[tuple[int, int]]


def retry(conn: psycopg.Connection, ids: list[int] | None, *, failed: bool = False,
          extra_attempts: int = 1) -> RetryResult:
    """Queue failed or cancelled jobs again (``ids``, or every failed job).

    A job whose dedupe key a live job of its kind holds is skipped and
    reported, and the others are queued all the same; of several candidates
    sharing one key, only the oldest is queued.  A producer that enqueues a
    job with such a key while this runs can still break the dedupe index
    (the statement saw no live holder): the statement is then run again,
    and it skips that job.
    """
    params = {"ids": ids or [], "all_failed": failed, "extra_attempts": extra_attempts}
    with db.translated():
        for tries in range(1, 4):
            try:
                with conn.transaction():
                    rows = conn.execute(q("retry"), params).fetchall()
                break
            except psycopg.errors.UniqueViolation:
                if tries == 3:
                    raise
    return RetryResult(requeued=[r[0] for r in rows if r[1]],
                       skipped=[(r[0], r[2]) for r in rows if not r[1]])


def cancel(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    """Cancel queued or running jobs; return the ids that were."""
    with db.translated():
        rows = conn.execute(q("cancel_ids"), {"ids": ids}).fetchall()
    return sorted(r[0] for r in rows)


def failed(conn: psycopg.Connection, *, limit: int = 20, queue: str | None = None,
           kind: str | None = None) -> list[dict[str, Any]]:
    """The newest failed jobs first, with their errors and tracebacks, as
    stored (the CLI escapes them for the terminal)."""
    with db.translated():
        rows = conn.execute(q("failed_jobs"), {"limit": limit, "queue": queue, "kind": kind}).fetchall()
    return [
        {"id": r[0], "queue": r[1], "kind": r[2], "attempt": r[3], "attempts_spent": r[4], "max_attempts": r[5],
         "reclaims": r[6], "created_at": r[7].isoformat() if r[7] else None,
         "finished_at": r[8].isoformat() if r[8] else None, "last_error": r[9], "traceback": r[10]}
        for r in rows
    ]
