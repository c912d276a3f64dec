"""Each job kind's options in the database (``pgfence.kinds``).

``pgfence run`` and ``pgfence work`` record the options of the handlers they
load when they start; ``pgfence.enqueue()`` and a plain insert into
``pgfence.jobs`` then apply them (a trigger fills in what the producer left
out), so a producer that never imported the handler's module still puts the
job on the handler's queue with its limits.  ``updated_by`` names who wrote
a row: ``host:pid:instance`` of the supervisor (its instance id is its row
of ``pgfence.supervisors``) or the ``pgfence work`` worker's name.

A reload (SIGHUP) imports the handler modules again, and the options they
declare may have changed: the new heartbeat manager forked after it records
them with a :class:`KindsRecord`, a background step that retries until the
database answers, then ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import psycopg

from pgfence import limits
from pgfence.background import Service
from pgfence.store import db
from pgfence.store import kinds as kinds_store
from pgfence.store import limits as limits_store
from pgfence.registry import HandlerSpec


log = logging.getLogger("pgfence.heartbeat")


def register(conn: psycopg.Connection, specs: Iterable[HandlerSpec], *, by: str) -> list[str]:
    """Upsert the options of ``specs`` and their declared concurrency
    limits as written ``by`` (a supervisor's or worker's name); return the
    kinds whose row of either table was written (new or changed).
    Kinds not among ``specs`` are left as they are."""
    specs = list(specs)
    if not specs:
        return []
    with db.translated(), conn.transaction():
        changed = kinds_store.register(
            conn,
            kinds=[s.kind for s in specs],
            queues=[s.queue for s in specs],
            max_attempts=[s.max_attempts for s in specs],
            max_reclaims=[s.max_reclaims for s in specs],
            leases=[None if s.lease is None else float(s.lease) for s in specs],
            timeouts=[None if s.timeout is None else float(s.timeout) for s in specs],
            by=by,
        )
        # The declared concurrency limits (pgfence.limits), and the kinds'
        # jobs gated again where they changed.
        rates = [limits.parse_rate(s.rate) for s in specs]
        limited = limits_store.declare(conn, [s.kind for s in specs], [s.concurrency for s in specs],
                                       [s.per_key_concurrency for s in specs], rates, by=by)
        for kind in limited:
            limits_store.gate(conn, kind)
            limits_store.forget(conn, kind)   # a handler that declares none any more
    return sorted(set(changed) | set(limited))


def known(conn: psycopg.Connection, kind: str) -> bool:
    """Whether some worker has registered ``kind``."""
    with db.translated():
        return kinds_store.known(conn, kind)


class KindsRecord(Service[list[str]]):
    """Records ``specs`` in pgfence.kinds once, from a thread: retried every
    ``interval`` seconds while the database does not answer, then done."""

    thread_name = "pgfence-kinds"
    application_name = "pgfence kinds"
    failure = "options of the handlers' kinds not recorded in pgfence.kinds"

    def __init__(self, dsn: str, specs: Sequence[HandlerSpec], *, by: str, interval: float = 2.0) -> None:
        super().__init__(dsn, interval=interval, log=log)
        self.specs = list(specs)
        self.by = by
        #: The kinds the last step wrote (new or changed), None before one returned.
        self.changed: list[str] | None = None

    def run_once(self) -> list[str]:
        self.changed = register(self.connection(), self.specs, by=self.by)
        if self.changed:
            self.log.info("recorded the options of kind(s) %s in pgfence.kinds", ", ".join(self.changed))
        return self.changed

    def finished(self, result: list[str]) -> bool:
        return True
