"""History maintenance: day partitions created ahead, and retention.

Finished jobs live in ``pgfence.job_history``, one partition per day (UTC).
Retention drops a day's partition whole once the day ended more than the
retention ago, so its cost does not follow the number of jobs it held; jobs
in the default partition (those that finished while their day had no
partition) are deleted in keyset batches, as every finished job used to be.
A job is therefore kept between the retention and the retention plus a day.

Every worker runs :func:`maintain` every ``prune_interval``; a transaction
advisory lock lets one of them do each step at a time, and the others skip
it.  Each detach waits at most :data:`LOCK_TIMEOUT_MS` for its lock, so it
never stands long in front of the completions that insert into history.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import psycopg

from pgfence.store import admin, db, periodic

log = logging.getLogger("pgfence.retention")

BATCH = 1000
#: The longest a detach or a drop waits for a lock before it gives up until
#: the next round.
LOCK_TIMEOUT_MS = 500
#: The transaction advisory lock of history maintenance ("pgfhis" in ASCII).
LOCK_KEY = 0x706766686973


class Maintained(NamedTuple):
    """What one round of :func:`maintain` did."""

    #: Day partitions created ahead.
    created: int
    #: Day partitions of expired days dropped.
    dropped: int
    #: Finished jobs deleted from the default partition.
    deleted: int
    #: Ticks of schedules decided longer than the retention ago, deleted
    #: (their jobs' history goes with the partitions).
    ticks: int = 0
    #: Rows of pgfence.job_attempts that ended longer than the retention
    #: ago, deleted.
    attempts: int = 0


def ensure_partitions(conn: psycopg.Connection, ahead: int = admin.HISTORY_AHEAD_DAYS) -> int:
    """Create the missing day partitions of today through ``ahead`` days
    ahead; how many were created (0, and no lock taken, when none is missing
    or another process is at it)."""
    with db.translated(), conn.transaction():
        if not admin.maintenance_try_lock(conn, LOCK_KEY):
            return 0
        admin.history_lock_timeout(conn, LOCK_TIMEOUT_MS)
        return admin.history_partitions_ahead(conn, ahead)


def drop_partitions(conn: psycopg.Connection, retention: float) -> int:
    """Detach, then drop, each day partition whose day ended more than
    ``retention`` seconds ago; how many were dropped.  The detach and the
    drop are two transactions, so that the parent's lock is held only for
    the catalog change, not while the files are removed.  A lock that does
    not come within the timeout ends the round: the next one retries."""
    dropped = 0
    with db.translated():
        for part in admin.history_partitions_expired(conn, retention=retention):
            try:
                if part.attached:
                    with conn.transaction():
                        if not admin.maintenance_try_lock(conn, LOCK_KEY):
                            break
                        admin.history_lock_timeout(conn, LOCK_TIMEOUT_MS)
                        admin.history_partition_remove(conn, part.name, drop=False)
                with conn.transaction():
                    if not admin.maintenance_try_lock(conn, LOCK_KEY):
                        break
                    admin.history_lock_timeout(conn, LOCK_TIMEOUT_MS)
                    dropped += admin.history_partition_remove(conn, part.name, drop=True)
            except psycopg.errors.LockNotAvailable:
                log.info("history partition %s is busy; it is dropped at the next round", part.name)
                break
    return dropped


def prune_once(conn: psycopg.Connection, retention: float, batch: int = BATCH) -> int:
    """Delete one batch from the default partition; how many rows it deleted."""
    with db.translated():
        return admin.prune_batch(conn, retention=retention, batch=batch)


def prune(conn: psycopg.Connection, retention: float, batch: int = BATCH, max_batches: int = 1000) -> int:
    """Delete the default partition's jobs finished more than ``retention``
    seconds ago; return the count.

    Each batch is its own short statement, so a large backlog never holds
    locks for long; ``max_batches`` bounds one run.
    """
    total = 0
    for _ in range(max_batches):
        deleted = prune_once(conn, retention, batch)
        total += deleted
        if deleted < batch:
            break
    return total


def maintain(conn: psycopg.Connection, retention: float | None) -> Maintained:
    """One round: partitions created ahead, then (unless ``retention`` is
    None, which keeps every job) expired days dropped and old jobs of the
    default partition deleted."""
    created = ensure_partitions(conn)
    if retention is None:
        return Maintained(created, 0, 0)
    return Maintained(created, drop_partitions(conn, retention), prune(conn, retention),
                      prune_ticks(conn, retention), prune_attempts(conn, retention))


def prune_attempts(conn: psycopg.Connection, retention: float, batch: int = BATCH * 10,
                   max_batches: int = 100) -> int:
    """Delete the attempt rows (pgfence.job_attempts) that ended more than
    ``retention`` seconds ago, in batches; the count.  They follow the
    history's retention: a job's failed attempts go about when the job does
    (its day partition is dropped between the retention and a day later)."""
    total = 0
    with db.translated():
        for _ in range(max_batches):
            deleted = admin.prune_attempts(conn, retention=retention, batch=batch)
            total += deleted
            if deleted < batch:
                break
    return total


def prune_ticks(conn: psycopg.Connection, retention: float, batch: int = BATCH * 10, max_batches: int = 100) -> int:
    """Delete the ticks of schedules decided more than ``retention`` seconds
    ago (ticks queued behind a running job stay), in batches; the count."""
    total = 0
    with db.translated():
        for _ in range(max_batches):
            deleted = periodic.prune(conn, retention, batch)
            total += deleted
            if deleted < batch:
                break
    return total
