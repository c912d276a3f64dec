"""A scratch database for the one-off measurements: created, migrated up to
a version, dropped afterwards."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgfence.store import migrate

DEFAULT_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def argv(index: int, default: int) -> int:
    """The integer command-line argument at ``index``, else ``default``."""
    given = [a for a in sys.argv if not a.startswith("--")]
    return int(given[index]) if len(given) > index else default


def admin_dsn() -> str:
    """The admin DSN: the first command-line argument, else the local server."""
    given = [a for a in sys.argv if not a.startswith("--")]
    return given[1] if len(given) > 1 else DEFAULT_ADMIN


@contextmanager
def scratch_database(admin: str, upto: int | None) -> Iterator[psycopg.Connection]:
    """An autocommit connection to a new database migrated up to ``upto``
    (every migration, as ``pgfence migrate`` does, with None); the database
    is dropped at the end."""
    name = f"pgfence_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(make_conninfo("", **{**conninfo_to_dict(admin), "dbname": name}),
                             autocommit=True) as conn:
            if upto is None:
                migrate.apply(conn)
            else:
                conn.execute("CREATE SCHEMA pgfence")
                for m in migrate.available():
                    if m.version <= upto:
                        conn.execute(m.sql())
            yield conn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
