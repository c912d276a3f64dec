"""The dashboard's statements (``sql/queries/web.sql``): one function per
named query, typed rows.  Retry and cancel are the operators' own
(:mod:`pgfence.store.admin`), pauses and the supervisors up are
:mod:`pgfence.store.operations`; the dashboard adds the job list, a job's
attempts and delete."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

import psycopg

from pgfence.store.queries import q

class JobFilter(NamedTuple):
    """The job list's filters; None: not filtered on."""

    queue: str | None = None
    kind: str | None = None
    status: str | None = None
    id: int | None = None
    dedupe_key: str | None = None
    #: A case-insensitive substring of the job's last error.
    error: str | None = None


class JobRow(NamedTuple):
    id: int
    queue: str
    kind: str
    status: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: dt.datetime
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    dedupe_key: str | None
    last_error: str | None


def _params(where: JobFilter, statuses: list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = where._asdict()
    params["statuses"] = statuses
    return params


def jobs_page(conn: psycopg.Connection, where: JobFilter, *, before: int | None, limit: int,
              upto: int | None = None, statuses: list[str] | None = None) -> list[JobRow]:
    """Up to ``limit`` jobs matching ``where`` (and with a status among
    ``statuses`` if given), newest first, with ids below ``before`` and up
    to ``upto`` (None: no bound)."""
    params = _params(where, statuses) | {"before": before, "upto": upto, "limit": limit}
    return [JobRow._make(row) for row in conn.execute(q("web_jobs_page"), params).fetchall()]


def jobs_count(conn: psycopg.Connection, where: JobFilter, statuses: list[str] | None = None, *,
               upto: int | None = None) -> tuple[int, int | None]:
    """How many jobs match (with ids up to ``upto`` if given), and the
    largest id among them (None: none)."""
    row = conn.execute(q("web_jobs_count"), _params(where, statuses) | {"upto": upto}).fetchone()
    assert row is not None
    return int(row[0]), row[1]


class JobDetail(NamedTuple):
    id: int
    queue: str
    kind: str
    status: str
    payload: Any
    attempt: int
    max_attempts: int
    reclaims: int
    max_reclaims: int
    priority: int
    putbacks: int
    run_at: dt.datetime
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    lease_until: dt.datetime | None
    #: The running job's owner, or the worker of a finished job's last attempt.
    worker: str | None
    dedupe_key: str | None
    last_error: str | None
    last_traceback: str | None
    #: What the handler returned (a done job's; None: nothing stored).
    result: Any
    #: The database's clock when the row was read.
    now: dt.datetime
    #: The key its kind's per-key concurrency counts it under (live jobs).
    concurrency_key: str | None = None
    #: Why a queued job waits: ``concurrency`` (its limit's slots are all
    #: held) or ``scheduled`` (held by a limit, its run_at still to come).
    held_back: str | None = None


def job(conn: psycopg.Connection, job_id: int) -> JobDetail | None:
    """The job ``job_id``, live or finished; None when there is none."""
    row = conn.execute(q("web_job"), {"id": job_id}).fetchone()
    return None if row is None else JobDetail._make(row)


class AttemptRow(NamedTuple):
    """One attempt that did not simply succeed."""

    attempt: int
    worker: str | None
    started_at: dt.datetime | None
    ended_at: dt.datetime
    #: error, lease_lost, fence_rejected, released, cancelled or timeout.
    outcome: str
    detail: str | None
    #: The error's traceback (an error or a timeout; migration 0015), or None.
    traceback: str | None = None


def job_attempts(conn: psycopg.Connection, job_id: int) -> list[AttemptRow]:
    """The recorded attempts of ``job_id``, in order."""
    return [AttemptRow._make(row) for row in conn.execute(q("web_job_attempts"), {"id": job_id}).fetchall()]


def delete_ids(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    """Delete the queued and finished jobs among ``ids`` (never a running
    one), with their attempt rows; the ids deleted, sorted."""
    return [job_id for (job_id,) in conn.execute(q("web_delete_ids"), {"ids": ids}).fetchall()]


class RecentCounts(NamedTuple):
    queue: str
    done: int
    failed: int


def recent(conn: psycopg.Connection, seconds: float) -> list[RecentCounts]:
    """Per queue, the jobs finished done and failed in the last ``seconds``."""
    return [RecentCounts._make(row) for row in conn.execute(q("web_recent"), {"seconds": seconds}).fetchall()]


def has_schedules(conn: psycopg.Connection) -> bool:
    row = conn.execute(q("web_has_schedules")).fetchone()
    return bool(row and row[0])


def session(conn: psycopg.Connection, statement_ms: int) -> None:
    """Once per connection: a statement timeout of ``statement_ms``."""
    conn.execute(q("web_session"), {"ms": str(statement_ms)})
