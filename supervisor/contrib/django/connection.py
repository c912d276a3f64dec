"""Django's database connection, as pgfence uses it: the psycopg 3
connection under an alias, what is wrong with an alias for pgfence, the
DSN a ``manage.py pgfence`` command runs with, and the sockets a forked
worker child must drop.

Everything the backend writes goes on Django's own connection, so that a
task enqueued inside ``transaction.atomic()`` commits or rolls back with
it, and a task's fenced ORM writes commit with its completion.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from psycopg.abc import Loader
from psycopg.pq import Format

#: Django's OPTIONS of a PostgreSQL database that are Django's own, not
#: libpq's: left out of the DSN a pgfence command is given.
DJANGO_ONLY = frozenset({"pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory",
                         "prepare_threshold", "context", "autocommit"})


def problem(alias: str) -> str | None:
    """Why the database ``alias`` cannot carry pgfence's jobs, or None:
    no such alias, not PostgreSQL, or PostgreSQL through psycopg2."""
    if alias not in connections.settings:
        return f"DATABASES has no alias {alias!r} (the OPTIONS' DATABASE of the pgfence tasks backend)"
    engine = connections.settings[alias].get("ENGINE", "")
    if engine != "django.db.backends.postgresql":
        return f"the database {alias!r} is not PostgreSQL (ENGINE {engine!r}); pgfence needs PostgreSQL"
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return (f"the database {alias!r} is reached through psycopg2; pgfence needs psycopg 3 "
                "(pip install 'psycopg[binary]', which Django then prefers)")
    return None


def psycopg_connection(alias: str) -> psycopg.Connection[Any]:
    """The psycopg connection under Django's ``alias``, connected, in the
    state Django left it (autocommit, or inside the caller's atomic block)."""
    found = problem(alias)
    if found:
        raise ImproperlyConfigured(found)
    conn = connections[alias]
    conn.ensure_connection()
    raw = conn.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(f"the database {alias!r} is not reached through psycopg 3")
    return raw


def json_reader(raw: psycopg.Connection[Any]) -> Any:
    """How to read a jsonb column read on ``raw``: Django loads jsonb as text
    (for its JSONField's own decoder), psycopg as Python values."""
    oid = psycopg.adapters.types["jsonb"].oid
    loader: type[Loader] | None = raw.adapters.get_loader(oid, Format.TEXT)
    if loader is not None and loader.__module__ != "psycopg.types.json":
        # Django's TextLoader (psycopg's, or psycopg_binary's C twin).
        return lambda value: json.loads(value) if isinstance(value, str | bytes) else value
    return lambda value: value


def dsn(alias: str) -> tuple[str, str | None]:
    """The libpq DSN of Django's database ``alias`` (as the test runner may
    have renamed it), without its password, and the password apart: it goes
    to the environment (``PGPASSWORD``), never on a command line or into a
    process title."""
    found = problem(alias)
    if found:
        raise ImproperlyConfigured(found)
    settings_dict = connections[alias].settings_dict
    params: dict[str, Any] = {key: value for key, value in (settings_dict.get("OPTIONS") or {}).items()
                              if key not in DJANGO_ONLY and key != "password" and value is not None}
    for key, name in (("NAME", "dbname"), ("USER", "user"), ("HOST", "host"), ("PORT", "port")):
        if settings_dict.get(key):
            params[name] = str(settings_dict[key])
    password = settings_dict.get("PASSWORD") or (settings_dict.get("OPTIONS") or {}).get("password") or None
    return psycopg.conninfo.make_conninfo(**params), password


def drop_inherited() -> None:
    """In a process just forked: forget the database connections inherited
    from the parent without a word to the server.

    Closing one the ordinary way would send the server a Terminate message
    on the socket the parent shares, and end the parent's session.  Each
    socket is first pointed at /dev/null, so what its closing writes goes
    nowhere; then Django is told the connection is gone and opens its own.
    """
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in connections.all(initialized_only=True):
            raw = conn.connection
            if raw is None:
                continue
            with contextlib.suppress(OSError, psycopg.Error):
                os.dup2(devnull, raw.pgconn.socket)
            conn.connection = None
            conn.closed_in_transaction = False
            conn.in_atomic_block = False
            conn.needs_rollback = False
            conn.savepoint_ids = []
            with contextlib.suppress(OSError, psycopg.Error):
                raw.close()
    finally:
        os.close(devnull)
