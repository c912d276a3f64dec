"""Periodic jobs' statements (``sql/queries/periodic.sql``): the
scheduler's and the listing of ``pgfence periodic``; one function per named
query, typed rows."""


from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from pgfence.scheduling.schedule import Schedule
from pgfence.store.queries import q


class Locked(NamedTuple):
    """A schedule this round decides, its row locked."""

    name: str
    checked_until: dt.datetime
    last_tick: dt.datetime | None
    last_job_id: int | None
    #: The job of its last enqueued tick is still queued or running.
    busy: bool
    #: Its ticks waiting behind that job (overlap queue), oldest first.
    queued: list[dt.datetime]
    #: The database's clock, read once the lock was held.
    now: dt.datetime


def declare(conn: psycopg.Connection[Any], schedule: Schedule) -> None:
    conn.execute(q("periodic_declare"), {
        "name": schedule.name, "kind": schedule.kind, "queue": schedule.queue, "cron": schedule.cron,
        "every_seconds": schedule.every, "tz": schedule.tz,
        "payload": Jsonb({} if schedule.payload is None else schedule.payload),
        "overlap": schedule.overlap, "catch_up": schedule.catch_up})


def lock(conn: psycopg.Connection[Any], names: list[str]) -> list[Locked]:
    """Lock the rows of ``names`` that no other scheduler holds now."""
    return [Locked._make(row) for row in conn.execute(q("periodic_lock"), {"names": names}).fetchall()]


def clock(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The database's clock (clock_timestamp())."""
    row = conn.execute(q("periodic_clock")).fetchone()
    assert row is not None
    now: dt.datetime = row[0]
    return now


def _job(schedule: Schedule, tick: dt.datetime) -> dict[str, Any]:
    return {"schedule": schedule.name, "tick": tick, "kind": schedule.kind,
            "payload": Jsonb({} if schedule.payload is None else schedule.payload), "queue": schedule.queue,
            "dedupe_key": schedule.dedupe_key(tick)}


def enqueue(conn: psycopg.Connection[Any], schedule: Schedule, tick: dt.datetime) -> tuple[int, float]:
    """Record ``tick`` enqueued and enqueue its job: (job id, lag in seconds).
    A second row for the same tick raises UniqueViolation."""
    row = conn.execute(q("periodic_enqueue"), _job(schedule, tick)).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def dequeue(conn: psycopg.Connection[Any], schedule: Schedule, tick: dt.datetime) -> tuple[int, float] | None:
    """Enqueue the job of a queued tick: (job id, lag), or None if the tick
    is no longer queued."""
    row = conn.execute(q("periodic_dequeue"), _job(schedule, tick)).fetchone()
    return None if row is None else (int(row[0]), float(row[1]))


def record(conn: psycopg.Connection[Any], schedule: str, tick: dt.datetime, outcome: str) -> None:
    """Record ``tick`` as ``skipped`` or ``queued``."""
    conn.execute(q("periodic_record"), {"schedule": schedule, "tick": tick, "outcome": outcome})


def advance(conn: psycopg.Connection[Any], name: str, now: dt.datetime, last_tick: dt.datetime | None,
            last_job_id: int | None, missed: int) -> None:
    conn.execute(q("periodic_advance"), {"name": name, "now": now, "last_tick": last_tick,
                                         "last_job_id": last_job_id, "missed": missed})


def last_runs(conn: psycopg.Connection[Any], names: list[str]) -> dict[str, str | None]:
    """The status of each schedule's last enqueued job (None: none)."""
    return {row[0]: row[1] for row in conn.execute(q("periodic_last_runs"), {"names": names}).fetchall()}


def prune(conn: psycopg.Connection[Any], retention: float, batch: int = 10_000) -> int:
    """Delete up to ``batch`` ticks decided longer than ``retention`` seconds
    ago (queued ones stay); how many."""
    return conn.execute(q("periodic_prune"), {"retention": retention, "batch": batch}).rowcount

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
    declared_at: dt.datetime
    checked_until: dt.datetime
    last_tick: dt.datetime | None
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
    now: dt.datetime


def list_schedules(conn: psycopg.Connection) -> list[ScheduleListing]:
    """Every schedule, by name."""
    return [ScheduleListing._make(row) for row in conn.execute(q("periodic_list")).fetchall()]
