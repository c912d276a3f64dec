"""Applies the numbered migrations of ``sql/migrations`` in order.

Idempotent: applied versions are recorded in ``pgfence.migrations``.  Safe
when several processes migrate at once: everything runs in one transaction
that first takes a transaction-level advisory lock, so the second migrator
waits, then finds the work done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable

import psycopg

from pgfence.store import admin, db
from pgfence.store.queries import q, sql_files

#: The advisory lock key that serialises migrators ("pgfence" in ASCII).
LOCK_KEY = 0x7067666E6365

#: The migration that creates pgfence.job_history, whose day partitions
#: every migrate keeps ready ahead (as the workers' maintenance does).
HISTORY_VERSION = 9

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    #: The file, read through importlib.resources (it may sit in a wheel).
    path: Traversable

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def available() -> list[Migration]:
    found = []
    for file in sql_files("migrations"):
        match = _FILE.match(file.name)
        if not match:
            raise ValueError(f"migration file name not NNNN_name.sql: {file.name}")
        found.append(Migration(int(match.group(1)), match.group(2), file))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError("two migrations share a version number")
    return found


def apply(conn: psycopg.Connection) -> list[Migration]:
    """Apply the missing migrations; return those applied by this call."""
    done: list[Migration] = []
    with db.translated(), conn.transaction():
        conn.execute(q("migrations_lock"), {"key": LOCK_KEY})
        conn.execute(q("migrations_bootstrap"))
        applied = _applied(conn)
        for migration in available():
            if migration.version in applied:
                continue
            conn.execute(migration.sql())
            conn.execute(q("migrations_record"), {"version": migration.version, "name": migration.name})
            done.append(migration)
        # History's day partitions, today and a few days ahead, on every
        # run: cheap when they exist (the workers keep them ahead too).
        if HISTORY_VERSION in applied | {m.version for m in done}:
            admin.history_partitions_ahead(conn, admin.HISTORY_AHEAD_DAYS)
    return done


def pending(conn: psycopg.Connection) -> list[Migration]:
    """Migrations not yet applied (all of them when the schema is missing)."""
    with db.translated():
        applied = _applied(conn) if _table_exists(conn) else set()
    return [m for m in available() if m.version not in applied]


def _table_exists(conn: psycopg.Connection) -> bool:
    """Whether pgfence.migrations is there yet (a new database has none)."""
    row = conn.execute(q("migrations_table_exists")).fetchone()
    return row is not None and bool(row[0])


def _applied(conn: psycopg.Connection) -> set[int]:
    """The versions already applied."""
    return {version for (version,) in conn.execute(q("migrations_applied"))}
