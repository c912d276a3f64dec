"""The operators' statements and the maintenance ones
(``sql/queries/admin.sql``): one function per named query, typed rows."""

from __future__ import annotations

import datetime
from typing import NamedTuple

import psycopg

from pgfence.store.queries import q

#: Day partitions of history kept ready after today's.
HISTORY_AHEAD_DAYS = 3


class StatusCount(NamedTuple):
    queue: str
    status: str
    jobs: int


def status_counts(conn: psycopg.Connection, *, percent: float = 100.0) -> list[StatusCount]:
    """Jobs per queue and status, by queue then status: live jobs counted
    exactly, finished ones from ``percent`` percent of history's pages,
    scaled up (100: exact)."""
    return [StatusCount._make(row) for row in conn.execute(q("status_counts"), {"percent": percent})]


def history_estimate(conn: psycopg.Connection) -> float:
    """The planner's estimate of the rows in history, from the catalog alone."""
    row = conn.execute(q("history_estimate")).fetchone()
    return float(row[0]) if row else 0.0


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
    """Delete up to ``batch`` finished jobs older than ``retention`` seconds
    from history's default partition; how many it deleted."""
    return len(conn.execute(q("prune_batch"), {"retention": retention, "batch": batch}).fetchall())


def history_partitions_ahead(conn: psycopg.Connection, days: int) -> int:
    """Create the missing day partitions of today through ``days`` ahead
    (UTC); how many were created."""
    row = conn.execute(q("history_partitions_ahead"), {"days": days}).fetchone()
    return int(row[0]) if row else 0


class ExpiredPartition(NamedTuple):
    name: str
    #: False for a table a detach left behind without its drop.
    attached: bool


def history_partitions_expired(conn: psycopg.Connection, *, retention: float) -> list[ExpiredPartition]:
    """The day partitions (and detached day tables) whose day ended more
    than ``retention`` seconds ago, oldest first."""
    rows = conn.execute(q("history_partitions_expired"), {"retention": retention}).fetchall()
    return [ExpiredPartition._make(row) for row in rows]


def history_lock_timeout(conn: psycopg.Connection, ms: int) -> None:
    """Wait at most ``ms`` milliseconds for any lock, until the transaction ends."""
    conn.execute(q("history_lock_timeout"), {"ms": str(ms)})


def history_partition_remove(conn: psycopg.Connection, name: str, *, drop: bool) -> bool:
    """Detach a day partition from history (``drop`` False), or drop its
    table once detached (``drop`` True); whether the step was done."""
    row = conn.execute(q("history_partition_remove"), {"name": name, "drop": drop}).fetchone()
    return bool(row and row[0])


def maintenance_try_lock(conn: psycopg.Connection, key: int) -> bool:
    """Take the maintenance lock ``key`` until the transaction ends, if free."""
    row = conn.execute(q("maintenance_try_lock"), {"key": key}).fetchone()
    return bool(row and row[0])


def prune_attempts(conn: psycopg.Connection, *, retention: float, batch: int) -> int:
    """Delete up to ``batch`` attempt rows that ended more than ``retention``
    seconds ago; how many it deleted."""
    return conn.execute(q("prune_attempts"), {"retention": retention, "batch": batch}).rowcount
