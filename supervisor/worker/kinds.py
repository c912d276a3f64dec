"""Each job kind's options in the database (``pgfence.kinds``).

``pgfence run`` and ``pgfence work`` record the options of the handlers they
load when they start; ``pgfence.enqueue()`` and a plain insert into
``pgfence.jobs`` then apply them (a trigger fills in what the producer left
out), so a producer that never imported the handler's module still puts the
job on the handler's queue with its limits.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

import psycopg

from pgfence.store import db
from pgfence.store import kinds as kinds_store
from pgfence.registry import HandlerSpec


def register(conn: psycopg.Connection, specs: Iterable[HandlerSpec]) -> list[str]:
    """Upsert the options of ``specs``; return the kinds whose row was
    written (new or changed).  Kinds not among ``specs`` are left as they are."""
    specs = list(specs)
    if not specs:
        return []
    with db.translated():
        return kinds_store.register(
            conn,
            kinds=[s.kind for s in specs],
            queues=[s.queue for s in specs],
            max_attempts=[s.max_attempts for s in specs],
            max_reclaims=[s.max_reclaims for s in specs],
            leases=[None if s.lease is None else float(s.lease) for s in specs],
            timeouts=[None if s.timeout is None else float(s.timeout) for s in specs],
            by=f"{socket.gethostname()}:{os.getpid()}",
        )


def known(conn: psycopg.Connection, kind: str) -> bool:
    """Whether some worker has registered ``kind``."""
    with db.translated():
        return kinds_store.known(conn, kind)
