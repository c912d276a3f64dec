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
    #: The rate in force: at most rate_count starts a rate_period (seconds).
    rate_count: int | None = None
    rate_period: float | None = None
    declared_rate: tuple[int, float] | None = None
    set_rate: tuple[int, float] | None = None


def declare(conn: psycopg.Connection[Any], kinds: Sequence[str], concurrency: Sequence[int | None],
            per_key: Sequence[int | None], rates: Sequence[tuple[int, float] | None], *, by: str) -> list[str]:
    """Record the declared limits of ``kinds`` (parallel lists; a rate as
    (starts, period seconds)); the kinds whose row was written, sorted."""
    params = {"kinds": list(kinds), "concurrency": list(concurrency), "per_key": list(per_key),
              "rate_counts": [r and r[0] for r in rates], "rate_periods": [r and r[1] for r in rates], "by": by}
    return sorted(kind for (kind,) in conn.execute(q("limits_declare"), params))


def set_limits(conn: psycopg.Connection[Any], kind: str, concurrency: int | None, per_key: int | None,
               *, by: str, rate: tuple[int, float] | None = None) -> tuple[int | None, int | None]:
    """Set ``kind``'s run-time limits (None: unchanged); those in force."""
    row = conn.execute(q("limits_set"), {"kind": kind, "concurrency": concurrency, "per_key": per_key,
                                         "rate_count": rate and rate[0], "rate_period": rate and rate[1],
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


def forget(conn: psycopg.Connection[Any], kind: str) -> bool:
    """Drop ``kind``'s row if no limit is left on it; whether it was."""
    return conn.execute(q("limits_forget"), {"kind": kind}).rowcount > 0


def list_limits(conn: psycopg.Connection[Any]) -> list[LimitRow]:
    """Every kind with a limits row, with its use."""
    found = []
    for row in conn.execute(q("limits_list")):
        *head, rate_count, rate_period, d_count, d_period, s_count, s_period = row
        found.append(LimitRow._make([*head, rate_count, rate_period,
                                     None if d_count is None else (d_count, d_period),
                                     None if s_count is None else (s_count, s_period)]))
    return found


def admit_due(conn: psycopg.Connection[Any]) -> int:
    """Admit the held jobs whose run_at came; how many."""
    row = conn.execute(q("admit_due")).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def next_rate_at(conn: psycopg.Connection[Any]) -> float | None:
    """Seconds until a rate lets a held job start; None: none waits on one."""
    row = conn.execute(q("next_rate_at")).fetchone()
    return None if row is None or row[0] is None else float(row[0])
