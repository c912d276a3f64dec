"""The Job a handler receives: the contract handlers are written against.

::

    @handler("send_receipt")
    def send_receipt(job: Job) -> None:
        job.check()                   # raises LeaseLost once the lease is gone
        with job.fenced() as conn:    # the handler's writes + the fenced completion
            conn.execute("INSERT ...")

A handler that never calls :meth:`Job.fenced` is completed (fenced) by the
worker when it returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import db, metrics
from .errors import LeaseLost
from .lease import Lease
from .queries import q


def idempotency_key(job_id: int, kind: str, dedupe_key: str | None) -> str:
    """The key for effects outside the database.

    It is derived from the job's identity, never from its attempt, so every
    attempt of one job sends the same key.  A job enqueued with a dedupe key
    uses that key, so re-enqueuing the same business event gets the same key.
    """
    if dedupe_key:
        return f"pgfence:{kind}:{dedupe_key}"
    return f"pgfence:job:{job_id}"


@dataclass(eq=False)
class Job:
    id: int
    kind: str
    queue: str
    attempt: int
    payload: dict[str, Any]
    lease: Lease
    max_attempts: int = 1
    dedupe_key: str | None = None
    #: The connection of the worker that runs the job (fenced() writes on it).
    conn: psycopg.Connection | None = field(default=None, repr=False)
    #: False only in the demo's unprotected mode: complete by id alone.
    fence: bool = True
    #: Set once the job's completion has been committed.
    completed: bool = False

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.id, self.kind, self.dedupe_key)

    @property
    def lease_lost(self) -> bool:
        """True once this attempt is known to have lost the job."""
        return self.lease.lost() is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone; cheap, call it often
        and always before an effect outside the database."""
        reason = self.lease.lost()
        if reason is not None:
            raise LeaseLost(self.id, self.attempt, reason)

    @contextlib.contextmanager
    def fenced(self) -> Iterator[psycopg.Connection]:
        """A transaction holding the handler's writes and the fenced completion.

        On a clean exit of the block the job is marked done in the same
        transaction, but only if this attempt still owns it; otherwise every
        write of the block is rolled back and :class:`LeaseLost` is raised.
        The fence compares the token, not the clock: an attempt whose lease
        ran out while nobody reclaimed the job still completes it.
        """
        if self.conn is None:
            raise RuntimeError("this job is not attached to a worker connection")
        if self.completed:
            raise RuntimeError(f"job {self.id} is already completed")
        try:
            with db.translated(), self.conn.transaction():
                yield self.conn
                self._complete_in_transaction()
        except psycopg.errors.SerializationFailure:
            self._rejected()
            raise LeaseLost(self.id, self.attempt, "fence_rejected") from None
        self.completed = True

    def _complete_in_transaction(self) -> None:
        if self.fence:
            row = self.conn.execute(q("complete"), {"id": self.id, "attempt": self.attempt}).fetchone()
        else:
            row = self.conn.execute(q("complete_unfenced"), {"id": self.id}).fetchone()
        if row is None:
            self._rejected()
            # Raising inside the transaction block rolls the handler's writes back.
            raise LeaseLost(self.id, self.attempt, "fence_rejected")

    def _rejected(self) -> None:
        metrics.DOUBLE_RUN_PREVENTED.labels(self.queue, self.kind).inc()
        self.lease.mark_lost("fence_rejected")
