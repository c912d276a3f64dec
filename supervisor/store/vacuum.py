"""Vacuum of the jobs table and what holds it back
(``sql/queries/vacuum.sql``): one function per named query, typed rows."""

from __future__ import annotations

from typing import NamedTuple

import psycopg

from pgfence.errors import PgfenceError
from pgfence.store.queries import q


class VacuumStats(NamedTuple):
    """pgfence.jobs' vacuum state and the xmin horizon, as this role sees them."""

    dead_tuples: int
    live_tuples: int
    #: Seconds since the last VACUUM or autovacuum of the table (or since
    #: the statistics began, if none is recorded).
    since_vacuum: float
    vacuum_count: int
    autovacuum_count: int
    #: The server's autovacuum (and track_counts) is on.
    autovacuum_server: bool
    #: The table's autovacuum_enabled option is not false.
    autovacuum_table: bool
    #: Age in seconds of the oldest holder of the horizon whose start this
    #: role can see (0: none).
    horizon_age: float
    #: That holder, as ``pid 42 (psql, idle in transaction)``.
    horizon_holder: str | None
    #: Holders with no visible start, each as ``key description``: the key
    #: stays the same while the holder holds the same xmin.
    untimed: list[str]
    #: This role may VACUUM the table.
    may_vacuum: bool

    @property
    def autovacuum(self) -> bool:
        """Autovacuum runs for the table."""
        return self.autovacuum_server and self.autovacuum_table


def vacuum_stats(conn: psycopg.Connection) -> VacuumStats:
    """The one row of vacuum state of pgfence.jobs."""
    row = conn.execute(q("vacuum_stats")).fetchone()
    if row is None:
        raise PgfenceError("pgfence.jobs has no row in pg_stat_user_tables")
    return VacuumStats._make(row)


def vacuum_jobs(conn: psycopg.Connection) -> None:
    """VACUUM (SKIP_LOCKED) pgfence.jobs; ``conn`` must be in autocommit."""
    conn.execute(q("vacuum_jobs"))
