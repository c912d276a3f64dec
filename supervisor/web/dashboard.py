"""One dashboard's state: its options, the signer of its cookies and CSRF
tokens, its connection pool, its templates (what the guard, the pages and
the forms share) and the runner of its bulk actions."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jinja2
import psycopg
from psycopg_pool import ConnectionPool

from pgfence.store import db
from pgfence.store import web as store
from pgfence.web import auth
from pgfence.web.bulk import BATCH, LEASE, REST, BulkRunner

#: Connections of one dashboard: a page reads on one at a time.
POOL_SIZE = 4


#: The longest statement the dashboard runs (a count over a large history).
STATEMENT_MS = 60_000


class Dashboard:
    """One dashboard: its options, its signer, its pool and its templates."""

    def __init__(self, dsn: str, *, read_only: bool, redact_payloads: bool, password: str | None,
                 secret: bytes | None, bulk_batch: int = BATCH, bulk_lease: float = LEASE,
                 bulk_rest: float = REST) -> None:
        if bulk_batch < 1:
            raise ValueError("a bulk action's batch must be at least 1 job")
        self.dsn = dsn
        self.read_only = read_only
        self.redact_payloads = redact_payloads
        self.password = password or None
        self.signer = auth.Signer(secret)
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        #: Jobs per transaction of the bulk actions started here.
        self.bulk_batch = bulk_batch
        #: Runs the bulk actions (none in read-only mode: look, don't touch).
        self.runner = None if read_only else BulkRunner(dsn, lease=bulk_lease, rest=bulk_rest)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("pgfence.web", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)

    @property
    def pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None:
                def configure(conn: psycopg.Connection[Any]) -> None:
                    store.session(conn, STATEMENT_MS)

                pool: ConnectionPool = ConnectionPool(
                    db.conninfo(self.dsn, application_name="pgfence-web"), min_size=0, max_size=POOL_SIZE,
                    open=False, timeout=10.0, configure=configure, name="pgfence-web",
                    # Autocommit: each read is its own snapshot, each action
                    # its own transaction.  Not prepared: the job list's
                    # filters fold away only in a plan made for the values.
                    kwargs={"autocommit": True, "prepare_threshold": None})
                pool.open(wait=False)
                self._pool = pool
                self.start()
            return self._pool

    def start(self) -> None:
        """Start the runner of bulk actions (idempotent): at the first
        request, or before ``pgfence web`` listens."""
        if self.runner is not None:
            self.runner.start()

    def wake_runner(self) -> None:
        """A bulk action was recorded: the runner looks at once."""
        if self.runner is not None:
            self.runner.start()
            self.runner.wake()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, driver errors translated."""
        with db.translated(self.dsn), self.pool.connection() as conn:
            yield conn

    def close(self) -> None:
        """Stop the runner (it gives up its actions) and close the pool."""
        if self.runner is not None:
            self.runner.stop()
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def pretty_json(value: Any) -> str:
    """A payload as indented JSON text (escaped later, by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
