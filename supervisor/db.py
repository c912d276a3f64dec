"""Connections, DSN resolution and the one place where driver errors become
pgfence errors.

The DSN comes from ``--dsn``, then ``PGFENCE_DSN``, then ``DATABASE_URL``;
with none of them pgfence starts its embedded PostgreSQL.  A DSN is shown to
people only through :func:`redact`, which drops the password.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .errors import DatabaseUnavailable, LeaseLost, PgfenceError, SchemaMissing

#: Seconds to wait for a TCP connection before calling the database unreachable.
CONNECT_TIMEOUT = 5


def resolve_dsn(cli_dsn: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The DSN to use, or None when the embedded server should be started."""
    env = os.environ if env is None else env
    for value in (cli_dsn, env.get("PGFENCE_DSN"), env.get("DATABASE_URL")):
        if value:
            return value
    return None


def redact(dsn: str) -> str:
    """The DSN with its password removed, fit for logs and messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable dsn>"
    params.pop("password", None)
    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


_URI_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:([^@/?#]*)@")
#: A URI's password anywhere in a text (an argument like ``--dsn=postgresql://...``).
_URI_PASSWORD_ANYWHERE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#\s]*:([^@/?#\s]*)@")
_KV_PASSWORD = re.compile(r"\bpassword\s*=\s*('(?:\\.|[^'\\])*'?|\S+)")


def scrub(text: str, dsn: str | None) -> str:
    """``text`` with ``dsn`` and any password written in it masked.

    libpq quotes the part of a DSN it cannot parse, sometimes the whole URI,
    password included, so its messages about a DSN pass through here.
    """
    if not dsn:
        return text
    secrets = [dsn]
    for pattern in (_URI_PASSWORD, _KV_PASSWORD):
        secrets += [m.group(1).strip("'") for m in pattern.finditer(dsn)]
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def has_password(text: str) -> bool:
    """Whether ``text`` looks like a DSN (URI or key/value) holding a password."""
    return bool(_URI_PASSWORD_ANYWHERE.search(text) or _KV_PASSWORD.search(text))


def mask_passwords(text: str) -> str:
    """``text`` (a command-line argument, say) with the password of a DSN in
    it replaced by ``***``, the rest kept as written."""
    text = _URI_PASSWORD_ANYWHERE.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + "***@", text)
    return _KV_PASSWORD.sub("password=***", text)


def conninfo(dsn: str, application_name: str = "pgfence", **extra: object) -> str:
    """The DSN with pgfence's connection defaults added.

    TCP keepalives and ``tcp_user_timeout`` make a connection that stops
    carrying packets fail within seconds instead of hanging for minutes, so a
    partition is seen before a lease could run out.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(f"invalid DSN: {scrub(first_line(exc), dsn)}") from None
    defaults = {
        "application_name": application_name,
        "connect_timeout": CONNECT_TIMEOUT,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        "tcp_user_timeout": 10000,
    }
    for key, value in defaults.items():
        params.setdefault(key, value)
    params.update(extra)
    return make_conninfo("", **params)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate(exc: BaseException, dsn: str | None = None) -> PgfenceError:
    """The pgfence error for a driver error."""
    if isinstance(exc, PgfenceError):
        return exc
    # Without the schema, PostgreSQL names the missing schema (a function
    # call) or the missing pgfence table; a wrongly typed call is not that.
    if isinstance(exc, pgerrors.InvalidSchemaName) or (
            isinstance(exc, pgerrors.UndefinedTable) and "pgfence." in str(exc)):
        return SchemaMissing(f"pgfence schema missing ({first_line(exc)}): run 'pgfence migrate'")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
        where = f" ({redact(dsn)})" if dsn else ""
        return DatabaseUnavailable(f"database unreachable{where}: {scrub(first_line(exc), dsn)}")
    return PgfenceError(f"database error: {first_line(exc)}")


@contextlib.contextmanager
def translated(dsn: str | None = None) -> Iterator[None]:
    """Re-raise driver errors inside the block as pgfence errors."""
    try:
        yield
    except PgfenceError:
        raise
    except (psycopg.Error, OSError) as exc:
        raise translate(exc, dsn) from exc


def array_literal(values: Iterable[int | float]) -> str:
    """A PostgreSQL array literal of numbers, sent as one bound parameter
    that the SQL casts (``%(ids)s::bigint[]``).  psycopg adapts a Python
    list element by element: 8 ms for the three lists of a 1,000-lease
    renewal, against 0.6 ms for this."""
    return "{" + ",".join(map(repr, values)) + "}"


def prepare_threshold(prepare: bool) -> int | None:
    """psycopg's ``prepare_threshold``: prepare from the first execution, or
    never (PgBouncer in transaction pooling)."""
    return 0 if prepare else None


def connect(dsn: str, *, autocommit: bool = True, application_name: str = "pgfence",
            prepare: bool = False) -> psycopg.Connection:
    """Open one connection, translating failures into DatabaseUnavailable.

    ``prepare`` makes the server keep a plan for each statement; only the
    worker's connection, which runs the same few statements for ever, asks
    for it.
    """
    with translated(dsn):
        return psycopg.connect(
            conninfo(dsn, application_name=application_name),
            autocommit=autocommit,
            prepare_threshold=prepare_threshold(prepare),
        )


def is_serialization_failure(exc: BaseException) -> bool:
    return isinstance(exc, pgerrors.SerializationFailure)


def fence_error(exc: BaseException, job_id: int, attempt: int) -> LeaseLost | None:
    """A serialization failure on a fenced write means another attempt won."""
    if is_serialization_failure(exc):
        return LeaseLost(job_id, attempt, "fence_rejected")
    return None
