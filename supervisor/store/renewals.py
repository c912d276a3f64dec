"""The statements that keep leases and sessions (``sql/queries/heartbeat.sql``
and ``sql/queries/session.sql``): one function per named query."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import psycopg

from pgfence.store import db
from pgfence.store.queries import q


def session_settings(conn: psycopg.Connection, idle_ms: str) -> None:
    """Once per connection of a worker or of the heartbeat: the server ends
    a session idle inside a transaction for ``idle_ms`` milliseconds ('0':
    never), and TCP keepalives find a vanished host within seconds."""
    conn.execute(q("session_settings"), {"idle_ms": idle_ms})


async def session_settings_async(conn: psycopg.AsyncConnection, idle_ms: str) -> None:
    """:func:`session_settings` on an async connection."""
    await conn.execute(q("session_settings"), {"idle_ms": idle_ms})


def renewal_settings(conn: psycopg.Connection, *, statement_ms: str, idle_ms: str) -> None:
    """For the rest of the caller's transaction (a renewal): a statement
    timeout, an idle-in-transaction timeout, and no sequential scan."""
    conn.execute(q("renewal_settings"), {"ms": statement_ms, "idle_ms": idle_ms})


def renew(conn: psycopg.Connection, ids: Iterable[int], attempts: Iterable[int],
          leases: Iterable[float]) -> set[tuple[int, int]]:
    """Renew many leases in one statement (after :func:`renewal_settings`,
    in the same transaction); the ``(id, attempt)`` pairs renewed.  The
    others are no longer owned by that attempt (see :func:`renew_verdicts`).
    The pairs are the rows as they come: a renewal of a thousand leases
    makes no object per lease beyond them."""
    params = {"ids": db.array_literal(ids), "attempts": db.array_literal(attempts),
              "leases": db.array_literal(leases)}
    renewed: set[tuple[int, int]] = set(conn.execute(q("renew"), params).fetchall())
    return renewed


class Verdict(NamedTuple):
    """Where a job whose lease was not renewed stands now."""

    status: str
    attempt: int


def renew_verdicts(conn: psycopg.Connection, ids: list[int]) -> dict[int, Verdict]:
    """The current status and attempt of the jobs ``ids``, by id."""
    return {job_id: Verdict(status, attempt)
            for job_id, status, attempt in conn.execute(q("renew_verdicts"), {"ids": ids})}
