"""Connections, DSN resolution and the one place where driver errors become
pgfence errors.

The DSN comes from ``--dsn``, then ``PGFENCE_DSN``, then ``DATABASE_URL``;
with none of them pgfence starts its embedded PostgreSQL.  A DSN is shown to
people only through :func:`redact`, which drops the password.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgfence.errors import (DatabaseError, DatabaseUnavailable, PgfenceError, SchemaMissing, StatementCanceled,
                            TransactionConflict)

log = logging.getLogger("pgfence.db")

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
        params: dict[str, Any] = dict(conninfo_to_dict(dsn))
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


#: SQLSTATEs that mean the session is gone or cannot be had: the server shut
#: down, crashed or is starting (57P01-57P03), too many connections (53300),
#: a session ended by idle_in_transaction_session_timeout (25P03) or
#: idle_session_timeout (57P05).  Class 08 (connection exceptions) too.
_UNAVAILABLE = {"57P01", "57P02", "57P03", "57P05", "53300", "25P03"}
#: SQLSTATEs of a statement the server aborted to break a deadlock or a
#: serialization failure: nothing was written, it may run again at once.
_CONFLICT = {"40001", "40P01"}


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error or of a translated one, else None."""
    code: str | None = getattr(exc, "sqlstate", None)
    return code


def translate(exc: BaseException, dsn: str | None = None, *, connecting: bool = False) -> PgfenceError:
    """The pgfence error for a driver error, by the class of its SQLSTATE.

    Only a connection that cannot be had or that broke is
    :class:`DatabaseUnavailable` (any failure to connect, SQLSTATE class 08,
    the server shutting down, a session ended by a timeout, a network or
    driver error without SQLSTATE).  A deadlock or serialization failure is
    a :class:`TransactionConflict`, a statement timeout or cancel a
    :class:`StatementCanceled`, anything else (a data error, an index row
    too big, a lock not available...) a :class:`DatabaseError`; each with
    the server's message and SQLSTATE.
    """
    if isinstance(exc, PgfenceError):
        return exc
    code = sqlstate(exc)
    # Without the schema, PostgreSQL names the missing schema (a function
    # call) or the missing pgfence table; a wrongly typed call is not that.
    if isinstance(exc, pgerrors.InvalidSchemaName) or (
            isinstance(exc, pgerrors.UndefinedTable) and "pgfence." in str(exc)):
        return SchemaMissing(f"pgfence schema missing ({first_line(exc)}): run 'pgfence migrate'")
    if (connecting or isinstance(exc, psycopg.InterfaceError | OSError)
            or (code is None and isinstance(exc, psycopg.OperationalError))
            or (code is not None and (code.startswith("08") or code in _UNAVAILABLE))):
        where = f" ({redact(dsn)})" if dsn else ""
        return DatabaseUnavailable(f"database unreachable{where}: {scrub(first_line(exc), dsn)}", code)
    message = scrub(first_line(exc), dsn)
    if code in _CONFLICT:
        return TransactionConflict(f"transaction conflict: {message} (SQLSTATE {code})", code)
    if code == "57014":
        return StatementCanceled(f"statement canceled: {message} (SQLSTATE {code})", code)
    return DatabaseError(f"database error: {message}" + (f" (SQLSTATE {code})" if code else ""), code)


@contextlib.contextmanager
def translated(dsn: str | None = None, *, connecting: bool = False) -> Iterator[None]:
    """Re-raise driver errors inside the block as pgfence errors."""
    try:
        yield
    except PgfenceError:
        raise
    except (psycopg.Error, OSError) as exc:
        raise translate(exc, dsn, connecting=connecting) from exc


#: Tries of a statement the server aborted to break a deadlock or a
#: serialization failure (see retrying).
CONFLICT_TRIES = 5

T = TypeVar("T")


def retrying(run: Callable[[], T], dsn: str | None = None, *, what: str = "statement",
             tries: int = CONFLICT_TRIES) -> T:
    """``run()`` with driver errors translated; a :class:`TransactionConflict`
    (deadlock, serialization failure) runs it again at once, up to ``tries``
    times in all, then is raised.  ``run`` must be a whole transaction (an
    autocommit statement, or a block that opens and ends its own
    transaction): the server rolled back everything it did."""
    for attempt in range(1, tries + 1):
        try:
            with translated(dsn):
                return run()
        except TransactionConflict as exc:
            _again(exc, attempt, tries, what)
    raise AssertionError("unreachable")


async def retrying_async(run: Callable[[], Awaitable[T]], dsn: str | None = None, *, what: str = "statement",
                         tries: int = CONFLICT_TRIES) -> T:
    """:func:`retrying` for a coroutine function."""
    for attempt in range(1, tries + 1):
        try:
            with translated(dsn):
                return await run()
        except TransactionConflict as exc:
            _again(exc, attempt, tries, what)
    raise AssertionError("unreachable")


def _again(exc: TransactionConflict, attempt: int, tries: int, what: str) -> None:
    """Raise ``exc`` after the last try; else log that it runs again."""
    if attempt >= tries:
        raise exc
    log.info("%s: %s; running it again (try %d of %d)", what, exc, attempt + 1, tries)


def array_literal(values: Iterable[int | float]) -> str:
    """A PostgreSQL array literal of numbers, sent as one bound parameter
    that the SQL casts (``%(ids)s::bigint[]``).  psycopg adapts a Python
    list element by element: 8 ms for the three lists of a 1,000-lease
    renewal, against 0.6 ms for this."""
    return "{" + ",".join(map(repr, values)) + "}"


def text_array_literal(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of texts, for the same reason as
    :func:`array_literal` (``%(queues)s::text[]``): each element quoted,
    its backslashes and double quotes escaped, so any text comes back as
    itself (``NULL``, commas, braces and spaces included)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


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
    with translated(dsn, connecting=True):
        return psycopg.connect(
            conninfo(dsn, application_name=application_name),
            autocommit=autocommit,
            prepare_threshold=prepare_threshold(prepare),
        )


async def connect_async(dsn: str, *, application_name: str = "pgfence",
                        prepare: bool = False) -> psycopg.AsyncConnection:
    """:func:`connect` for an event loop: one autocommit connection."""
    with translated(dsn, connecting=True):
        return await psycopg.AsyncConnection.connect(
            conninfo(dsn, application_name=application_name),
            autocommit=True,
            prepare_threshold=prepare_threshold(prepare),
        )


#: The SQLSTATE that pgfence.complete_fenced (complete_or_raise) raises when
#: the fence refuses an attempt.
FENCE_REJECTED = "PF001"
#: SQLSTATEs of a fenced completion refused because another attempt owns the
#: job: PF001 from the raising completion, or a serialization failure
#: (40001), which under an isolation level above READ COMMITTED means that
#: another transaction changed the job first.
_FENCE_REFUSED = {FENCE_REJECTED, "40001"}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors behind it (a pgfence error wraps a driver
    error; an error raised while handling another keeps it as context)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        candidate = todo.pop(0)
        if candidate is None or id(candidate) in seen:
            continue
        seen.add(id(candidate))
        yield candidate
        todo += [candidate.__cause__, candidate.__context__]


def fence_refused(exc: BaseException) -> bool:
    """Whether ``exc`` says the fence refused a completion: SQLSTATE PF001 or
    40001, on the error itself or on one behind it (wrapped in a pgfence
    error, or raised while another was handled: a fence refusal first)."""
    return any(sqlstate(candidate) in _FENCE_REFUSED for candidate in _chain(exc))


def pipeline_aborted(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error behind it) is psycopg's "pipeline
    aborted": the error of the statement that aborted the pipeline was read
    elsewhere, so this one cannot say whether the fence refused."""
    return any(isinstance(candidate, pgerrors.PipelineAborted) for candidate in _chain(exc))
