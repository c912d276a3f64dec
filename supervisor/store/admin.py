"""The operators' statements and the maintenance ones
(``sql/queries/admin.sql``): one function per named query, typed rows."""

from __future__ import annotations

import datetime
from typing import NamedTuple

import psycopg

from pgfence.store.queries import q


class StatusCount(NamedTuple):
    queue: str
    status: str
    jobs: int


def status_counts(conn: psycopg.Connection) -> list[StatusCount]:
    """Jobs per queue and status, by queue then status."""
    return [StatusCount._make(row) for row in conn.execute(q("status_counts"))]


class RunningJob(NamedTuple):
    id: int
    queue: str
    kind: str
    attempt: int
    locked_by: str | None
    #: Seconds of lease left by the database clock (negative once run out).
    lease_left: float | None


def running_jobs(conn: psycopg.Connection) -> list[RunningJob]:
    """Every running job with its owner and lease left, by id."""
    return [RunningJob._make(row) for row in conn.execute(q("running_jobs"))]


class RetryVerdict(NamedTuple):
    """One candidate of ``retry``: requeued, or skipped because the job
    ``holder`` holds its dedupe key."""

    id: int
    requeued: bool
    holder: int | None


def retry(conn: psycopg.Connection, ids: list[int], *, all_failed: bool, extra_attempts: int) -> list[RetryVerdict]:
    """Put failed or cancelled jobs back in the queue (``ids``, or with
    ``all_failed`` every failed job) with ``extra_attempts`` more; one
    verdict per candidate, by id.  Raises UniqueViolation when a producer
    took a dedupe key meanwhile (the caller runs it again)."""
    params = {"ids": ids, "all_failed": all_failed, "extra_attempts": extra_attempts}
    return [RetryVerdict._make(row) for row in conn.execute(q("retry"), params).fetchall()]


def cancel_ids(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    """Cancel the queued or running jobs among ``ids``; the ids cancelled, sorted."""
    return sorted(job_id for (job_id,) in conn.execute(q("cancel_ids"), {"ids": ids}))


class FailedJob(NamedTuple):
    id: int
    queue: str
    kind: str
    attempt: int
    #: Attempts spent (put-backs spent none).
    spent: int
    max_attempts: int
    reclaims: int
    created_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    last_error: str | None
    last_traceback: str | None


def failed_jobs(conn: psycopg.Connection, *, limit: int, queue: str | None, kind: str | None) -> list[FailedJob]:
    """The newest failed jobs first, optionally of one queue and one kind."""
    rows = conn.execute(q("failed_jobs"), {"limit": limit, "queue": queue, "kind": kind}).fetchall()
    return [FailedJob._make(row) for row in rows]


class QueueGauge(NamedTuple):
    queue: str
    status: str
    jobs: int
    #: Age in seconds of the queue's oldest queued job that is due (0: none).
    oldest_age: float


def queue_gauges(conn: psycopg.Connection) -> list[QueueGauge]:
    """Jobs per queue and status, with the age of each queue's oldest due job."""
    return [QueueGauge._make(row) for row in conn.execute(q("queue_gauges"))]


def prune_batch(conn: psycopg.Connection, *, retention: float, batch: int) -> int:
    """Delete up to ``batch`` finished jobs older than ``retention`` seconds;
    how many it deleted."""
    return len(conn.execute(q("prune_batch"), {"retention": retention, "batch": batch}).fetchall())
