"""The concurrency limits' statements (``sql/queries/limits.sql``).  Like
the other store modules, they neither translate driver errors nor retry."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg

from pgfence.store.queries import q


class LimitRow(NamedTuple):
    """A kind's limits in force, where they come from, and their use."""

    kind: str
    concurrency: int | None
    per_key_concurrency: int | None
    declared_concurrency: int | None
    declared_per_key: int | None
    set_concurrency: int | None
    set_per_key: int | None
    #: Slots held by running attempts (expired leases included, until reclaimed).
    running: int
    #: Slots held by jobs admitted and not claimed yet.
    admitted: int
    #: Jobs held back: all slots taken, or run_at still to come.
    waiting: int
    scheduled: int
    #: Concurrency keys holding a slot.
    keys: int
    updated_at: datetime.datetime
    updated_by: str | None


def declare(conn: psycopg.Connection[Any], kinds: Sequence[str], concurrency: Sequence[int | None],
            per_key: Sequence[int | None], *, by: str) -> list[str]:
    """Record the declared limits of ``kinds`` (parallel lists); the kinds
    whose row was written, sorted."""
    params = {"kinds": list(kinds), "concurrency": list(concurrency), "per_key": list(per_key), "by": by}
    return sorted(kind for (kind,) in conn.execute(q("limits_declare"), params))


def set_limits(conn: psycopg.Connection[Any], kind: str, concurrency: int | None, per_key: int | None,
               *, by: str) -> tuple[int | None, int | None]:
    """Set ``kind``'s run-time limits (None: unchanged); those in force."""
    row = conn.execute(q("limits_set"), {"kind": kind, "concurrency": concurrency, "per_key": per_key,
                                         "by": by}).fetchone()
    if row is None:   # an upsert's RETURNING always has its row
        raise AssertionError("limits_set returned no row")
    return row[1], row[2]


def reset(conn: psycopg.Connection[Any], kind: str, *, by: str) -> tuple[int | None, int | None] | None:
    """Drop ``kind``'s run-time limits; those in force, None without a row."""
    row = conn.execute(q("limits_reset"), {"kind": kind, "by": by}).fetchone()
    return None if row is None else (row[1], row[2])


def gate(conn: psycopg.Connection[Any], kind: str) -> int:
    """Gate ``kind``'s live jobs as its limits now stand; jobs admitted."""
    row = conn.execute(q("limits_gate"), {"kind": kind}).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def list_limits(conn: psycopg.Connection[Any]) -> list[LimitRow]:
    """Every kind with a limits row, with its use."""
    return [LimitRow(*row) for row in conn.execute(q("limits_list"))]


def admit_due(conn: psycopg.Connection[Any]) -> int:
    """Admit the held jobs whose run_at came; how many."""
    row = conn.execute(q("admit_due")).fetchone()
    return int(row[0]) if row and row[0] is not None else 0
