"""Operator commands: status, failed, retry, cancel, pause, resume.  Each
returns plain data, which the CLI prints as a table or as JSON.  Retry and
cancel are the Python API's (:mod:`pgfence.client`), which the command line
and the dashboard call directly."""

from __future__ import annotations

from typing import Any

import psycopg

from pgfence import names
from pgfence.admin.limits import rate_text
from pgfence.store import admin as store
from pgfence.store import db, operations
from pgfence.store import limits as limits_store


#: Up to this many rows of history (by the catalog's estimate), ``status``
#: counts finished jobs exactly; above it, from a sample of about this many
#: rows, scaled up, so that a status call over a hundred million finished
#: jobs reads what it would read over a million.
EXACT_HISTORY_ROWS = 1_000_000


def history_sample_percent(estimate: float, exact_rows: int = EXACT_HISTORY_ROWS) -> float:
    """The percentage of history's pages ``status`` reads: 100 (exact) up to
    ``exact_rows``, then just enough for about ``exact_rows`` rows."""
    if estimate <= exact_rows:
        return 100.0
    return max(0.001, 100.0 * exact_rows / estimate)


def status(conn: psycopg.Connection) -> dict[str, Any]:
    """Counts per queue and status (finished ones estimated from a sample
    when history is large: ``estimated`` says so), every running job with
    its lease, and, when any kind has concurrency or rate limits,
    ``limits``: per kind the limits in force, the slots in use and the jobs
    waiting."""
    with db.translated():
        counts: dict[str, dict[str, int]] = {}
        percent = history_sample_percent(store.history_estimate(conn), EXACT_HISTORY_ROWS)
        for count in store.status_counts(conn, percent=percent):
            counts.setdefault(count.queue, {})[count.status] = count.jobs
        running = [
            {"id": r.id, "queue": r.queue, "kind": r.kind, "attempt": r.attempt, "locked_by": r.locked_by,
             "lease_left": round(r.lease_left, 3) if r.lease_left is not None else None}
            for r in store.running_jobs(conn)
        ]
        limits = [limit_use(row) for row in limits_store.list_limits(conn)]
    data: dict[str, Any] = {"queues": counts, "running": running, "estimated": percent < 100.0}
    if limits:
        data["limits"] = limits
    return data


def limit_use(row: limits_store.LimitRow) -> dict[str, Any]:
    """One kind's line of ``status``'s limits: its limits in force (None:
    none; the rate as written, ``100/s``), the slots held (running and
    admitted) and the jobs held back (waiting for a slot or the rate, and
    held until their run_at)."""
    rate = None if row.rate_count is None or row.rate_period is None else (row.rate_count, row.rate_period)
    return {"kind": row.kind, "concurrency": row.concurrency, "per_key_concurrency": row.per_key_concurrency,
            "rate": rate_text(rate), "in_use": row.running + row.admitted, "running": row.running,
            "admitted": row.admitted, "waiting": row.waiting, "scheduled": row.scheduled}


def failed(conn: psycopg.Connection, *, limit: int = 20, queue: str | None = None,
           kind: str | None = None) -> list[dict[str, Any]]:
    """The newest failed jobs first, with their errors and tracebacks, as
    stored (the CLI escapes them for the terminal)."""
    with db.translated():
        rows = store.failed_jobs(conn, limit=limit, queue=queue, kind=kind)
    return [
        {"id": r.id, "queue": r.queue, "kind": r.kind, "attempt": r.attempt, "attempts_spent": r.spent,
         "max_attempts": r.max_attempts, "reclaims": r.reclaims,
         "created_at": r.created_at.isoformat() if r.created_at else None,
         "finished_at": r.finished_at.isoformat() if r.finished_at else None, "last_error": r.last_error,
         "traceback": r.last_traceback}
        for r in rows
    ]


def pause(conn: psycopg.Connection, queue: str, *, by: str | None = None) -> str:
    """Pause ``queue`` (its jobs are no longer claimed; running ones
    finish); what was done, as one line.  Idempotent."""
    names.check(queue, "queue")
    with db.translated(), conn.transaction():
        done = operations.pause(conn, queue, by=by)
        if done is not None:
            return f"paused queue {queue}: its jobs are not claimed until `pgfence resume {queue}`"
        since = {p.queue: p.paused_at for p in operations.pauses(conn)}.get(queue)
    when = f" (since {since.isoformat(timespec='seconds')})" if since else ""
    return f"queue {queue} was already paused{when}"


def resume(conn: psycopg.Connection, queue: str) -> str:
    """Resume a paused ``queue``; what was done, as one line.  Idempotent."""
    names.check(queue, "queue")
    with db.translated(), conn.transaction():
        done = operations.resume(conn, queue)
    if done is not None:
        return f"resumed queue {queue}"
    return f"queue {queue} was not paused"
