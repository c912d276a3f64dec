"""Retention: deletes finished jobs older than the retention, in keyset
batches, so the jobs table does not grow without bound under load."""

from __future__ import annotations

import psycopg

from pgfence.store import db
from pgfence.store import admin

BATCH = 1000


def prune_once(conn: psycopg.Connection, retention: float, batch: int = BATCH) -> int:
    """Delete one batch; return how many rows it deleted."""
    with db.translated():
        return admin.prune_batch(conn, retention=retention, batch=batch)


def prune(conn: psycopg.Connection, retention: float, batch: int = BATCH, max_batches: int = 1000) -> int:
    """Delete finished jobs older than ``retention`` seconds; return the count.

    Each batch is its own short statement, so a large backlog never holds
    locks for long; ``max_batches`` bounds one run.
    """
    total = 0
    for _ in range(max_batches):
        deleted = prune_once(conn, retention, batch)
        total += deleted
        if deleted < batch:
            break
    return total
