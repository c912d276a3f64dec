"""Paused queues and the supervisors registry (``sql/queries/operations.sql``,
tables of migration 0012): one function per named query, typed rows."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg

from pgfence.store import db
from pgfence.store.queries import q

#: The channel pause and resume notify (payload: the queue).
PAUSES_CHANNEL = "pgfence_pauses"
#: A supervisor seen within this many seconds is up.
UP_WITHIN = 30.0


class Pause(NamedTuple):
    queue: str
    paused_at: datetime.datetime
    paused_by: str | None = None


def pause(conn: psycopg.Connection, queue: str, *, by: str | None = None) -> Pause | None:
    """Pause ``queue`` (in the caller's transaction); the pause, or None when
    it was paused already."""
    row = conn.execute(q("queue_pause"), {"queue": queue, "by": by}).fetchone()
    return Pause(row[0], row[1], by) if row else None


def resume(conn: psycopg.Connection, queue: str) -> Pause | None:
    """Resume ``queue``; the pause that ended, or None when it was not paused."""
    row = conn.execute(q("queue_resume"), {"queue": queue}).fetchone()
    return Pause(row[0], row[1]) if row else None


def pauses(conn: psycopg.Connection) -> list[Pause]:
    """Every paused queue, by name."""
    return [Pause._make(row) for row in conn.execute(q("queue_pauses"))]


def paused_among(conn: psycopg.Connection, queues: Sequence[str]) -> frozenset[str]:
    """The queues of ``queues`` that are paused."""
    rows = conn.execute(q("paused_among"), {"queues": db.text_array_literal(queues)}).fetchall()
    return frozenset(queue for (queue,) in rows)


class HeldJob(NamedTuple):
    """A job a supervisor's child runs: the slot table's (id, attempt)."""

    child: int
    id: int
    attempt: int


class ChildInfo(NamedTuple):
    number: int
    pid: int


def supervisor_beat(conn: psycopg.Connection, *, instance: str, host: str, pid: int, workers: int, version: str,
                    started_at: datetime.datetime, children: Sequence[ChildInfo], held: Sequence[HeldJob]) -> None:
    """Insert or refresh this supervisor's row (last_seen = now()); each
    held job's ``child`` is its child's index in ``children``.  Jobs that
    are no longer running under that attempt are left out."""
    conn.execute(q("supervisor_beat"), {
        "instance": instance, "host": host, "pid": pid, "workers": workers, "version": version,
        "started_at": started_at,
        "numbers": db.array_literal([c.number for c in children]),
        "pids": db.array_literal([c.pid for c in children]),
        # WITH ORDINALITY counts from 1.
        "job_slots": db.array_literal([h.child + 1 for h in held]),
        "job_ids": db.array_literal([h.id for h in held]),
        "attempts": db.array_literal([h.attempt for h in held])})


def supervisor_gone(conn: psycopg.Connection, instance: str) -> bool:
    """Delete this supervisor's row; whether there was one."""
    return conn.execute(q("supervisor_gone"), {"instance": instance}).rowcount > 0


class Supervisor(NamedTuple):
    instance: str
    host: str
    pid: int
    workers: int
    version: str
    started_at: datetime.datetime
    last_seen: datetime.datetime
    #: [{"number", "pid", "jobs": [{"id", "kind", "queue", "attempt"}]}]
    children: list[dict[str, Any]]
    #: Seconds since last_seen, by the database clock.
    seen_ago: float


def supervisors_up(conn: psycopg.Connection, *, within: float = UP_WITHIN) -> list[Supervisor]:
    """The supervisors seen within ``within`` seconds, by host and pid."""
    return [Supervisor._make(row) for row in conn.execute(q("supervisors_up"), {"within": within})]
