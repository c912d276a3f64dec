"""The Job a handler receives: the contract handlers are written against.

::

    @handler("send_receipt")
    def send_receipt(job: Job) -> None:
        job.check()                   # raises LeaseLost once the lease is gone
        with job.fenced() as conn:    # the handler's writes + the fenced completion
            conn.execute("INSERT ...")

A handler that never calls :meth:`Job.fenced` (or :meth:`Job.fenced_writes`)
is completed (fenced) by the worker when it returns.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any, LiteralString, NoReturn

import psycopg
from psycopg.abc import Params, Query
from psycopg_pool import ConnectionPool

from pgfence.store import db
from pgfence.observe import metrics
from pgfence.store import sqltext
from pgfence.errors import LeaseLost, NotCommitted, TransactionConflict
from pgfence.scheduling.schedule import parse_tick_key
from pgfence.worker.lease import Lease
from pgfence.store import jobs, pools


def idempotency_key(job_id: int) -> str:
    """The key for effects outside the database: ``pgfence:job:<id>``.

    Derived from the job's id, never from its attempt: every attempt of one
    job sends the same key, and no two jobs of a database share one (ids
    are never reused), also when a later job has the same kind and dedupe
    key as an earlier one that finished.
    """
    return f"pgfence:job:{int(job_id)}"


def dedupe_idempotency_key(kind: str, dedupe_key: str) -> str:
    """The key shared by EVERY job of ``kind`` enqueued with ``dedupe_key``,
    ever (also after an earlier one finished):
    ``pgfence:dedupe:<kind>:<dedupe key>``, both parts percent-encoded, so
    that no two (kind, dedupe key) pairs, and no job id key, can give the
    same text.  Only for a dedupe key that names one business event whose
    effect must happen once in all time."""
    return f"pgfence:dedupe:{_part(kind)}:{_part(dedupe_key)}"


def _part(text: str) -> str:
    """``text`` percent-encoded (UTF-8): no ``:`` nor ``%`` is left, and the
    key stays ASCII (an HTTP header value)."""
    return urllib.parse.quote(text, safe="")


class RawJSON(str):
    """A job's payload as the claim returned it, not yet decoded."""

    __slots__ = ()


class JobBase:
    """One attempt of one job, as its handler sees it: what :class:`Job` and
    :class:`~pgfence.AsyncJob` share.

    ``payload`` is given as a Python value, or as :class:`RawJSON` that is
    decoded on first read, so a handler that never reads it never pays for
    the JSON.
    """

    id: int
    kind: str
    queue: str
    attempt: int
    lease: Lease
    max_attempts: int
    dedupe_key: str | None
    #: False only in the demo's unprotected mode: complete by id alone.
    fence: bool
    #: Set once the job's completion has been committed.
    completed: bool

    def __init__(self, id: int, kind: str, queue: str, attempt: int, payload: Any, lease: Lease,
                 max_attempts: int = 1, dedupe_key: str | None = None, *,
                 fence: bool = True, completed: bool = False) -> None:
        self.id = id
        self.kind = kind
        self.queue = queue
        self.attempt = attempt
        self._payload = payload
        self.lease = lease
        self.max_attempts = max_attempts
        self.dedupe_key = dedupe_key
        self.fence = fence
        self.completed = completed
        #: The handler's result as JSON text, set by the worker once the
        #: handler returned, for the completion to store (None: none).
        self._result: str | None = None

    @property
    def payload(self) -> Any:
        """The JSON value the job was enqueued with."""
        if isinstance(self._payload, RawJSON):
            self._payload = json.loads(self._payload)
        return self._payload

    @payload.setter
    def payload(self, value: Any) -> None:
        self._payload = value

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, kind={self.kind!r}, queue={self.queue!r}, "
                f"attempt={self.attempt!r}, "
                f"max_attempts={self.max_attempts!r}, dedupe_key={self.dedupe_key!r}, "
                f"completed={self.completed!r})")

    @property
    def idempotency_key(self) -> str:
        """``pgfence:job:<id>``: the same for every attempt of this job, and
        shared with no other job.  The job of a periodic tick has
        ``pgfence:periodic:<schedule>:<tick>`` instead: derived from the
        schedule and the tick, so that one tick's effects happen once
        whatever runs it."""
        if self.scheduled_for is not None:
            assert self.dedupe_key is not None
            return self.dedupe_key
        return idempotency_key(self.id)

    @property
    def scheduled_for(self) -> datetime.datetime | None:
        """The tick (UTC) a periodic job was enqueued for; None for a job
        that no schedule enqueued."""
        tick = parse_tick_key(self.dedupe_key)
        return None if tick is None else tick[1]

    @property
    def schedule(self) -> str | None:
        """The name of the schedule that enqueued this job, or None."""
        tick = parse_tick_key(self.dedupe_key)
        return None if tick is None else tick[0]

    @property
    def dedupe_idempotency_key(self) -> str | None:
        """The key shared by every job of this kind with this dedupe key,
        ever (see :func:`dedupe_idempotency_key`); None without a dedupe
        key.  Use it only when a later job with the same dedupe key must
        not repeat the effect of an earlier, finished one."""
        if not self.dedupe_key:
            return None
        return dedupe_idempotency_key(self.kind, self.dedupe_key)

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

    def _rejected(self) -> None:
        metrics.DOUBLE_RUN_PREVENTED.labels(self.queue, self.kind).inc()
        self.lease.mark_lost("fence_rejected")

    def _conflicted(self, exc: TransactionConflict) -> NoReturn:
        """A fenced block's transaction conflicted.  Translated by
        db.translated(): a serialization failure means another transaction
        changed the job first (an isolation level above READ COMMITTED), so
        the fence refused this attempt; a deadlock is an error like any
        other, raised as it is."""
        if not db.fence_refused(exc):
            raise exc
        self._rejected()
        raise LeaseLost(self.id, self.attempt, "fence_rejected") from None

    def _not_completed(self) -> None:
        if self.completed:
            raise RuntimeError(f"job {self.id} is already completed")

    def _raising_completion(self) -> tuple[LiteralString, dict[str, int]]:
        """The completion that raises PF001 when the fence refuses (or, in
        the demo's unprotected mode, completes by id alone)."""
        return jobs.raising_completion(self.id, self.attempt, fence=self.fence)


class Job(JobBase):
    """One attempt of one job, as an ordinary (``def``) handler sees it.

    Its writes go on a connection of the worker that runs it: ``conn``, the
    worker's own (a worker that runs one job at a time), or one borrowed from
    ``pool`` for the length of each write (a worker that runs many at once).
    A Job built with neither can be checked but not completed.
    """

    conn: psycopg.Connection[Any] | None
    pool: ConnectionPool | None

    def __init__(self, id: int, kind: str, queue: str, attempt: int, payload: Any, lease: Lease,
                 max_attempts: int = 1, dedupe_key: str | None = None, *,
                 conn: psycopg.Connection[Any] | None = None, pool: ConnectionPool | None = None,
                 fence: bool = True, completed: bool = False) -> None:
        super().__init__(id, kind, queue, attempt, payload, lease, max_attempts, dedupe_key, fence=fence,
                         completed=completed)
        self.conn = conn
        self.pool = pool

    @contextlib.contextmanager
    def borrow(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection this job writes on, for one write: the worker's
        own, or one of its pool's (given back at the end of the block)."""
        if self.pool is not None:
            with pools.connection(self.pool) as conn:
                yield conn
            return
        if self.conn is None:
            raise RuntimeError("this job is not attached to a worker connection")
        yield self.conn

    @contextlib.contextmanager
    def fenced(self, *, pipeline: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A transaction holding the handler's writes and the fenced completion.

        On a clean exit of the block the job is marked done in the same
        transaction, but only if this attempt still owns it; otherwise every
        write of the block is rolled back and :class:`LeaseLost` is raised.
        The fence compares the token, not the clock: an attempt whose lease
        ran out while nobody reclaimed the job still completes it.

        ``pipeline=True`` sends BEGIN, the block's statements, the completion
        and COMMIT to the server together, in one round trip instead of one
        per statement (about 40% less CPU per job for a one-row block).  The
        block's statements are then queued, not run at once: an error in one
        is raised when the block ends (or at the first fetch), and a cursor's
        ``rowcount`` is only known after a fetch.  Use it for blocks that
        write, or that read through ``fetchone()``/``fetchall()``; a nested
        ``conn.transaction()`` still works (a savepoint, with its own round
        trip).
        """
        self._not_completed()
        with db.translated(), self.borrow() as conn:
            if pipeline:
                with self._pipelined(conn) as pipelined:
                    yield pipelined
                return
            try:
                with db.translated(), conn.transaction():
                    yield conn
                    self._complete_in_transaction(conn)
            except TransactionConflict as exc:
                self._conflicted(exc)
            self.completed = True

    @contextlib.contextmanager
    def _pipelined(self, conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        # One round trip: [BEGIN, the block, complete_or_raise, COMMIT] Sync.
        # The completion raises PF001 when the fence refuses this attempt;
        # the server then skips everything up to the Sync, COMMIT included,
        # and the transaction is rolled back here.  psycopg's own pipelined
        # transaction() would sync once more before COMMIT to check the
        # block's results; the raising completion makes that check
        # server-side.  Transaction() still guards the block: conn.commit()
        # inside it raises, and a nested transaction() is a savepoint.
        with self._raising_fence(conn), conn.pipeline(), psycopg.Transaction(conn):
            yield conn
            conn.execute(*self._raising_completion())

    @contextlib.contextmanager
    def fenced_writes(self) -> Iterator[Writes]:
        """Writes committed with the fenced completion, all sent as ONE
        message: the cheapest way to finish a job whose last step only
        writes rows.

        The block receives a :class:`Writes` whose ``execute(query, params)``
        queues a statement; nothing is sent until the block ends.  Then
        ``BEGIN``, the statements, ``pgfence.complete_fenced`` and
        ``COMMIT`` go to the server in one simple-query message, with the
        parameters bound by psycopg on the client (its ``ClientCursor``), and
        come back in one round trip.  No result can be read: use
        :meth:`fenced` for blocks that read.  If this attempt lost the job,
        or a statement fails, nothing is kept, and :class:`LeaseLost` (or the
        error) is raised at the end of the block.
        """
        self._not_completed()
        writes = Writes()
        yield writes
        writes.execute(*self._raising_completion())
        with db.translated(), self.borrow() as conn, self._raising_fence(conn), psycopg.ClientCursor(conn) as cursor:
            # Each statement is checked to be exactly one, with no trailing
            # comment, quote or semicolon that could swallow the completion
            # or the COMMIT; the script is encoded as the connection encodes
            # (its client_encoding), not always as UTF-8.
            standard = conn.info.parameter_status("standard_conforming_strings") != "off"
            statements = [sqltext.one_statement(cursor.mogrify(query, params), standard_strings=standard)
                          for query, params in writes.statements]
            script = ";\n".join(["BEGIN", *statements, "COMMIT"]).encode(conn.info.encoding)
            cursor.execute(script)
            self._check_committed(conn, cursor, len(statements))

    def _check_committed(self, conn: psycopg.Connection[Any], cursor: psycopg.ClientCursor[Any],
                         statements: int) -> None:
        """After a one-message block: every statement answered, the last a
        COMMIT, the completion returned its row, and the connection out of
        any transaction.  Anything else means the completion did not commit
        as sent: raise NotCommitted (the caller rolls back)."""
        answers = [(cursor.statusmessage, cursor.rowcount)]
        while cursor.nextset():
            answers.append((cursor.statusmessage, cursor.rowcount))
        status = conn.info.transaction_status
        expected = statements + 2   # BEGIN, the statements (completion included), COMMIT
        if (status != psycopg.pq.TransactionStatus.IDLE or len(answers) != expected
                or answers[-1][0] != "COMMIT" or answers[-2][1] != 1):
            raise NotCommitted(f"job {self.id} attempt {self.attempt}: the one-message block did not commit "
                               f"({len(answers)} of {expected} statements answered, last "
                               f"{answers[-1][0]!r}, connection {status.name}); its writes were rolled back")

    @contextlib.contextmanager
    def _raising_fence(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Around a block sent in one round trip with the raising
        completion: a refusal becomes LeaseLost, any error ends the aborted
        transaction, success marks the job completed."""
        try:
            with db.translated():
                yield
        except BaseException as exc:
            rejected = db.fence_refused(exc)
            self._roll_back(conn)
            if not rejected and db.pipeline_aborted(exc):
                # The aborting error was read elsewhere (timing decides where
                # psycopg reads a pipeline's results): ask the fence itself.
                rejected = self._lost_ownership(conn)
            if rejected:
                self._rejected()
                raise LeaseLost(self.id, self.attempt, "fence_rejected") from None
            raise
        self.completed = True

    def _lost_ownership(self, conn: psycopg.Connection[Any]) -> bool:
        """True if this attempt is known to no longer own the job; False if
        it still does, or if the connection cannot tell."""
        if conn.closed:
            return False
        try:
            with db.translated():
                return not jobs.still_owned(conn, self.id, self.attempt)
        except Exception:  # noqa: BLE001 - the original error is raised instead
            return False

    def _roll_back(self, conn: psycopg.Connection[Any]) -> None:
        """After an error in a block sent in one round trip (pipelined or
        fenced_writes) the server holds an aborted transaction (its COMMIT
        was skipped): end it, if the connection still stands."""
        if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return
        try:
            conn.rollback()
        except psycopg.Error:
            # Broken: the server rolls back when the session ends, and the
            # worker opens a new connection on its next database error.
            conn.close()

    def store_result(self) -> None:
        """Store the result after the handler's own fenced block completed
        the job (the worker calls it once the handler returned)."""
        assert self._result is not None
        with db.translated(), self.borrow() as conn, conn.transaction():
            jobs.store_result(conn, self.id, self.attempt, self._result)

    def _complete_in_transaction(self, conn: psycopg.Connection[Any]) -> None:
        done = (jobs.complete(conn, self.id, self.attempt, self._result) if self.fence
                else jobs.complete_unfenced(conn, self.id))
        if not done:
            self._rejected()
            # Raising inside the transaction block rolls the handler's writes back.
            raise LeaseLost(self.id, self.attempt, "fence_rejected")


class Writes:
    """The statements of a :meth:`Job.fenced_writes` block, queued until it ends."""

    def __init__(self) -> None:
        self.statements: list[tuple[Query, Params | None]] = []

    def execute(self, query: Query, params: Params | None = None) -> None:
        """Queue one statement; its ``params`` are bound when the block ends."""
        self.statements.append((query, params))
