"""Operator commands for concurrency and rate limits: list them with their
use, set a kind's at run time, reset it to its handler's declaration.  A change is
one transaction that also gates the kind's live jobs again, so the next
claim of every supervisor obeys it, without a restart."""

from __future__ import annotations

from typing import Any

import psycopg

from pgfence import limits, names
from pgfence.errors import ConfigError
from pgfence.store import db
from pgfence.store import limits as store


def rate_text(rate: tuple[int, float] | None) -> str | None:
    """A rate as it is written: ``100/s``, ``10/min``, ``5/7200s``."""
    if rate is None:
        return None
    count, period = rate
    for unit, seconds in (("s", 1.0), ("min", 60.0), ("h", 3600.0), ("d", 86400.0)):
        if period == seconds:
            return f"{count}/{unit}"
    return f"{count}/{period:g}s"


def _use(row: store.LimitRow) -> dict[str, Any]:
    rate = None if row.rate_count is None or row.rate_period is None else (row.rate_count, row.rate_period)
    return {"kind": row.kind, "concurrency": row.concurrency, "per_key_concurrency": row.per_key_concurrency,
            "rate": rate_text(rate),
            "declared": {"concurrency": row.declared_concurrency, "per_key_concurrency": row.declared_per_key,
                         "rate": rate_text(row.declared_rate)},
            "set": {"concurrency": row.set_concurrency, "per_key_concurrency": row.set_per_key,
                    "rate": rate_text(row.set_rate)},
            "running": row.running, "admitted": row.admitted, "waiting": row.waiting,
            "scheduled": row.scheduled, "keys": row.keys,
            "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by}


def list_limits(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every kind with limits: those in force, declared and set, and the
    slots held (running, admitted) and jobs waiting."""
    with db.translated():
        return [_use(row) for row in store.list_limits(conn)]


def set_limits(conn: psycopg.Connection, kind: str, *, concurrency: int | None = None,
               per_key_concurrency: int | None = None, rate: str | None = None,
               by: str = "cli") -> dict[str, Any]:
    """Set ``kind``'s run-time limits (an argument left None stays as it
    was); ConfigError on bad input, before anything is written."""
    names.check(kind, "kind")
    limits.check_limit(concurrency, "concurrency")
    limits.check_limit(per_key_concurrency, "per-key concurrency")
    parsed = limits.parse_rate(rate)
    if concurrency is None and per_key_concurrency is None and parsed is None:
        raise ConfigError("give a concurrency, a per-key concurrency, a rate, or several")
    with db.translated(), conn.transaction():
        store.set_limits(conn, kind, concurrency, per_key_concurrency, by=by, rate=parsed)
        store.gate(conn, kind)
    return _found(conn, kind)


def reset(conn: psycopg.Connection, kind: str, *, by: str = "cli") -> dict[str, Any]:
    """Forget ``kind``'s run-time limits: its handler's declaration applies
    again.  ConfigError for a kind without limits."""
    names.check(kind, "kind")
    with db.translated(), conn.transaction():
        if store.reset(conn, kind, by=by) is None:
            raise ConfigError(f"kind {kind!r} has no limits to reset")
        store.gate(conn, kind)
        if store.forget(conn, kind):   # none left: its handler declares none
            return _unlimited(kind)
    return _found(conn, kind)


def _unlimited(kind: str) -> dict[str, Any]:
    """The listing of a kind without limits (its row dropped)."""
    none = {"concurrency": None, "per_key_concurrency": None, "rate": None}
    return {"kind": kind, **none, "declared": dict(none), "set": dict(none), "running": 0, "admitted": 0,
            "waiting": 0, "scheduled": 0, "keys": 0, "updated_at": None, "updated_by": None}


def _found(conn: psycopg.Connection, kind: str) -> dict[str, Any]:
    with db.translated():
        for row in store.list_limits(conn):
            if row.kind == kind:
                return _use(row)
    raise AssertionError(f"kind {kind!r} has no limits row after its change")
