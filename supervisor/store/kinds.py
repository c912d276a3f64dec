"""The kinds table's statements (``sql/queries/kinds.sql``)."""

from __future__ import annotations

from typing import Any

import psycopg

from pgfence.store.queries import q


def register(conn: psycopg.Connection[Any], *, kinds: list[str], queues: list[str | None],
             max_attempts: list[int | None], max_reclaims: list[int | None], leases: list[float | None],
             timeouts: list[float | None],
             by: str) -> list[str]:
    """Upsert the options of the kinds (parallel lists, one element per
    kind); the kinds whose row was written (new or changed), sorted."""
    params = {"kinds": kinds, "queues": queues, "max_attempts": max_attempts, "max_reclaims": max_reclaims,
              "leases": leases, "timeouts": timeouts, "by": by}
    return sorted(kind for (kind,) in conn.execute(q("kinds_register"), params))


def known(conn: psycopg.Connection, kind: str) -> bool:
    """Whether some worker has registered ``kind``."""
    row = conn.execute(q("kind_known"), {"kind": kind}).fetchone()
    return row is not None and bool(row[0])
