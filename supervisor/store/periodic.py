"""The listing of schedules for ``pgfence periodic`` (query ``periodic_list``
of ``sql/queries/periodic.sql``), typed rows.  The scheduler's statements
are in :mod:`pgfence.store.ticks`."""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

import psycopg

from pgfence.store.queries import q


# -- listing: `pgfence periodic` -----------------------------------------------------


class ScheduleListing(NamedTuple):
    """One schedule as ``pgfence periodic`` shows it: its definition as
    stored (the database does not check names, cron or tz: a row written
    by hand may hold anything), its last enqueued tick with that job's
    status, and its tick counts."""

    name: str
    kind: str
    #: None: the kind's queue.
    queue: str | None
    cron: str | None
    every_seconds: float | None
    tz: str
    payload: Any
    overlap: str
    catch_up: str
    declared_at: datetime.datetime
    checked_until: datetime.datetime
    last_tick: datetime.datetime | None
    last_job_id: int | None
    #: queued, running, done, failed or cancelled; None when there is no
    #: last job, or it is gone from history with retention.
    last_status: str | None
    #: Ticks recorded as skipped (overlap skip) and waiting (overlap queue),
    #: as long as pruning keeps them.
    skipped: int
    queued: int
    #: Ticks that fell while no scheduler ran and catch_up left out.
    missed: int
    #: The database's clock when the row was read.
    now: datetime.datetime


def list_schedules(conn: psycopg.Connection) -> list[ScheduleListing]:
    """Every schedule, by name."""
    return [ScheduleListing._make(row) for row in conn.execute(q("periodic_list")).fetchall()]
