"""The dashboard's bulk actions in the background (``sql/queries/bulk.sql``,
the table of migration 0013): one function per named query, typed rows.
The runner that uses them is :mod:`pgfence.web.bulk`."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from pgfence.store.queries import q


class BulkAction(NamedTuple):
    """One row of ``pgfence.bulk_actions``."""

    id: int
    #: retry, cancel or delete.
    action: str
    #: The job list's filter as the pages show it: the fields set, by name.
    filter: dict[str, Any]
    #: The largest id the confirmation counted.
    upto: int
    batch: int
    #: running, done or cancelled.
    state: str
    #: The jobs that matched when the runner started; None before it counted.
    matched: int | None
    acted: int
    left_alone: int
    batches: int
    #: Every matching job from this id up was read (None: none yet).
    cursor: int | None
    started_by: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    cancelled_by: str | None
    #: The runner that holds it (or last held it).
    owner: str | None
    lease_until: dt.datetime | None
    last_error: str | None


def create(conn: psycopg.Connection[Any], *, action: str, fields: dict[str, str], upto: int, batch: int,
           by: str) -> int:
    """A new running bulk action, owned by no runner yet; its id."""
    row = conn.execute(q("bulk_create"), {"action": action, "filter": Jsonb(fields), "upto": upto, "batch": batch,
                                          "by": by}).fetchone()
    assert row is not None
    action_id: int = row[0]
    return action_id


def claim(conn: psycopg.Connection[Any], *, owner: str, lease: float) -> int | None:
    """Take the oldest running action no live runner holds, for ``lease``
    seconds; its id, or None when there is none."""
    row = conn.execute(q("bulk_claim"), {"owner": owner, "lease": lease}).fetchone()
    if row is None:
        return None
    action_id: int = row[0]
    return action_id


def lock(conn: psycopg.Connection[Any], action_id: int, *, owner: str) -> BulkAction | None:
    """The action, its row locked until the transaction ends, while
    ``owner`` holds it and it runs; else None."""
    row = conn.execute(q("bulk_lock"), {"id": action_id, "owner": owner}).fetchone()
    return None if row is None else BulkAction._make(row)


def counted(conn: psycopg.Connection[Any], action_id: int, *, owner: str, matched: int, lease: float) -> None:
    """Record the count the action starts with, and renew its lease."""
    conn.execute(q("bulk_counted"), {"id": action_id, "owner": owner, "matched": matched, "lease": lease})


def progress(conn: psycopg.Connection[Any], action_id: int, *, owner: str, cursor: int | None, acted: int,
             left_alone: int, batches: int, finished: bool, lease: float) -> None:
    """One batch's progress (in the batch's transaction), the lease renewed;
    ``finished`` ends the action as done."""
    conn.execute(q("bulk_progress"), {"id": action_id, "owner": owner, "cursor": cursor, "acted": acted,
                                      "left_alone": left_alone, "batches": batches, "finished": finished,
                                      "lease": lease})


def note_error(conn: psycopg.Connection[Any], action_id: int, *, owner: str, error: str) -> None:
    """The error of a batch that failed (and is tried again)."""
    conn.execute(q("bulk_note_error"), {"id": action_id, "owner": owner, "error": error})


def release(conn: psycopg.Connection[Any], *, owner: str) -> int:
    """Give up every running action ``owner`` holds; how many."""
    return conn.execute(q("bulk_release"), {"owner": owner}).rowcount


def cancel(conn: psycopg.Connection[Any], action_id: int, *, by: str) -> BulkAction | None:
    """Cancel a running action; the row as cancelled, or None when it was
    not running (done, cancelled already, or no such action)."""
    row = conn.execute(q("bulk_cancel"), {"id": action_id, "by": by}).fetchone()
    return None if row is None else BulkAction._make(row)


def get(conn: psycopg.Connection[Any], action_id: int) -> BulkAction | None:
    row = conn.execute(q("bulk_action"), {"id": action_id}).fetchone()
    return None if row is None else BulkAction._make(row)


def recent(conn: psycopg.Connection[Any], limit: int) -> list[BulkAction]:
    """The newest ``limit`` actions, newest first."""
    return [BulkAction._make(row) for row in conn.execute(q("bulk_recent"), {"limit": limit}).fetchall()]


def session(conn: psycopg.Connection[Any], *, statement_ms: int, lock_ms: int) -> None:
    """Once per connection of a runner: its statement and lock timeouts."""
    conn.execute(q("bulk_session"), {"statement_ms": str(statement_ms), "lock_ms": str(lock_ms)})
