"""The worker: claims jobs, runs their handlers, completes them through the
fence.

One worker is one process with one connection.  In this module it runs on
its own (``pgfence work``), with the heartbeat manager in a thread; the
supervisor forks many of them and moves the heartbeat into a process of its
own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from psycopg_pool import ConnectionPool

from pgfence.store import db, operations, pools, renewals
from pgfence.store import jobs as store
from pgfence import errortext
from pgfence.observe import metrics
from pgfence import registry
from pgfence.worker import retention
from pgfence.errors import (DatabaseError, DatabaseUnavailable, LeaseLost, PayloadRejected, PgfenceError,
                     TransactionConflict)
from pgfence.renewal.renewer import HeartbeatManager, validate_heartbeat
from pgfence.job import Job, JobBase, RawJSON
from pgfence.worker.lease import Lease
from pgfence.settings import Settings
from pgfence.backoff import Backoff

log = logging.getLogger("pgfence.worker")

#: Outcomes returned by Worker.run_job, also what the tests assert.
DONE, RETRIED, FAILED, LOST, RELEASED = "done", "retried", "failed", "lost", "released"
#: A job of a kind this worker does not know, handed back for another worker.
PUT_BACK = "put_back"
#: A job run but not yet completed: its completion is batched with others.
DEFERRED = "deferred"
#: Seconds a finished job may wait for its batched completion.
DEFER_MAX = 0.1
#: At most this many seconds (or a tenth of the lease) between two claims of
#: a worker that also look for expired leases; the claims in between read
#: queued jobs alone.
RECLAIM_SCAN_INTERVAL = 1.0
#: An idle worker that sleeps until the next run_at wakes this much later,
#: so that the job is due by the database clock when the claim looks.
RUN_AT_MARGIN = 0.005


def default_name() -> str:
    """``host:pid:instance``: the random instance id tells this worker from
    one with the same host name and pid elsewhere (containers)."""
    from pgfence.prefork.child import new_instance_id   # child imports this module lazily too

    return f"{socket.gethostname()}:{os.getpid()}:{new_instance_id()}"


@dataclass
class Stats:
    claimed: int = 0
    reclaimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, outcome: str) -> None:
        # Jobs end on many threads at once in a worker that runs many.
        with self._lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def ran(self) -> int:
        """Jobs that ran (put-backs ran nothing)."""
        with self._lock:
            return sum(n for outcome, n in self.outcomes.items() if outcome != PUT_BACK)



class LeaseTracker(Protocol):
    """What renews a worker's leases while its jobs run: its own
    :class:`HeartbeatManager` (``pgfence work``) or, in a child of
    ``pgfence run``, the slot table the shared heartbeat manager reads."""

    def track(self, lease: Lease) -> None: ...

    def handler_started(self, lease: Lease) -> None: ...

    def untrack(self, lease: Lease) -> None: ...


class Worker:
    """Claims and runs jobs from ``settings.queues``.

    ``heartbeat`` is the manager that renews this worker's leases; when None
    the worker starts its own in a thread.  ``on_job`` (if given) is called
    with each job before and after it runs (the supervisor's process title).
    """

    def __init__(self, dsn: str, settings: Settings, *, name: str | None = None,
                 heartbeat: LeaseTracker | None = None,
                 on_job: Callable[[Job | None], None] | None = None):
        self.dsn = dsn
        self.settings = settings
        self.name = name or default_name()
        self.stats = Stats()
        #: The retry backoff of every failed attempt of this worker's jobs,
        #: also those its own heartbeat manager reports.
        self.retry_backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self.on_job = on_job
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._listening = False
        #: The manager this worker started itself (in a thread), if any.
        self._own: HeartbeatManager | None = None
        self.heartbeat: LeaseTracker | None = heartbeat
        if heartbeat is None and settings.renew:
            validate_heartbeat(settings.heartbeat, registry.specs())
            self.heartbeat = self._own = HeartbeatManager(
                dsn, default_lease=settings.lease, interval=settings.heartbeat,
                timeout_grace=settings.lost_lease_kill_after, prepare=settings.prepare, backoff=self.retry_backoff,
                idle_in_transaction_timeout=settings.idle_in_transaction_timeout)
        self._last_prune = time.monotonic()
        #: The thread that claims: the only one that uses (and may drop) the
        #: worker's own connection when jobs run on other threads.
        self._owner = threading.current_thread()
        #: When the next claim also looks for expired leases (monotonic).
        self._next_reclaim_scan = 0.0
        #: Handler run times of the batch in hand, observed at its end.
        self._durations: dict[tuple[str, str], list[float]] | None = None
        #: Unknown kinds already logged by this worker (once per kind).
        self._unknown_logged: set[str] = set()
        #: Jobs whose lease was lost to an outage and whose release the
        #: database did not answer: released (fenced) at the next round.
        self._unreleased: list[JobBase] = []
        #: The pool jobs write on in a worker that runs many at once (None:
        #: they write on the worker's own connection).
        self.pool: ConnectionPool | None = None
        #: The queues of settings.queues that are paused (left out of every
        #: claim), as last read; read again before the next claim once
        #: stale: a NOTIFY on pgfence_pauses, an idle wake, or, without
        #: LISTEN, every poll interval.
        self.paused: frozenset[str] = frozenset()
        #: Notifications read just before the last claim.
        self.notes_before_claim = 0
        self._pauses_stale = True
        self._pauses_read_at = 0.0

    # -- connection -----------------------------------------------------------

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = db.connect(self.dsn, application_name=f"pgfence worker {self.name}",
                              prepare=self.settings.prepare)
            # A session idle inside a transaction past the timeout is ended
            # by the server, so a worker frozen in a fenced() block does not
            # hold its rows' locks for ever (see session_settings).
            with db.translated(self.dsn):
                renewals.session_settings(conn, self.settings.idle_in_transaction_ms)
            # Listen before the first claim, so that no enqueue can fall
            # between a claim that found nothing and the LISTEN.  Behind a
            # transaction-pooling PgBouncer there is no session to listen
            # on: the worker polls instead.
            if self.settings.listen:
                with db.translated(self.dsn):
                    self._listen(conn)
            self._conn = conn
            self._listening = self.settings.listen
        return self._conn

    @staticmethod
    def _listen(conn: psycopg.Connection) -> None:
        """Enqueues (pgfence_jobs) and pauses (pgfence_pauses) wake the worker."""
        conn.execute("LISTEN pgfence_jobs")
        conn.execute("LISTEN " + operations.PAUSES_CHANNEL)

    # -- paused queues ------------------------------------------------------------

    def active_queues(self) -> list[str]:
        """The queues the claims take from: settings.queues but the paused."""
        paused = self.paused
        return [queue for queue in self.settings.queues if queue not in paused] if paused else \
            list(self.settings.queues)

    def refresh_pauses(self) -> None:
        """Read which queues are paused, if the last reading is stale; on the
        thread that claims (its connection).  The claim statement itself
        never changes: paused queues are left out of its queue list."""
        now = time.monotonic()
        if not self._pauses_stale and (self._listening or now < self._pauses_read_at + self.settings.poll_interval):
            return
        with db.translated(self.dsn):
            paused = operations.paused_among(self.conn, self.settings.queues)
        self._pauses_stale = False
        self._pauses_read_at = now
        if paused != self.paused:
            for queue in sorted(paused - self.paused):
                log.info("worker %s: queue %s is paused: not claiming from it", self.name, errortext.one_line(queue))
            for queue in sorted(self.paused - paused):
                log.info("worker %s: queue %s resumed", self.name, errortext.one_line(queue))
            self.paused = paused

    def _woken(self, notes: Iterable[psycopg.Notify]) -> bool:
        """Whether ``notes`` should wake an idle worker: an enqueue into one
        of its active queues, or any pause or resume (which also makes the
        pauses stale)."""
        woken = False
        for note in notes:
            if note.channel == operations.PAUSES_CHANNEL:
                self._pauses_stale = True
                woken = True
            elif not note.payload or (note.payload in self.settings.queues and note.payload not in self.paused):
                woken = True
        return woken

    def connect_with_retry(self) -> bool:
        """Connect, retrying with backoff while the database is unreachable
        (a worker outlives a database restart); False if asked to stop first."""
        delay = 0.1
        while not self.stopping:
            try:
                self.conn  # noqa: B018 - opens the connection
                return True
            except DatabaseUnavailable as exc:
                log.warning("worker %s cannot connect, retrying in %.1fs: %s", self.name, delay, exc)
                self._stop.wait(delay)
                delay = min(5.0, delay * 2)
        return False

    def close(self) -> None:
        if self._own is not None:
            self._own.stop()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- claim ----------------------------------------------------------------

    def claim(self, batch: int | None = None, kinds: list[str] | None = None,
              not_kinds: list[str] | None = None) -> list[Job]:
        """Claim up to ``batch`` jobs (of ``kinds`` only, or of every kind but
        ``not_kinds``, if given); return those to run (a reclaim past its
        budget comes back failed and is not returned)."""
        # A pause notified while this worker was busy is read here, with
        # the enqueues' notifications, which the claim below makes moot
        # (it sees every job they announced).
        self.notes_before_claim = self._drain_notifies()
        self.refresh_pauses()
        args, sent_at = self.claim_args(batch, kinds, not_kinds)
        with db.translated(self.dsn):
            rows = store.claim(self.conn, **args)
        return self.adopt(rows, sent_at)

    def claim_args(self, batch: int | None, kinds: list[str] | None,
                    not_kinds: list[str] | None) -> tuple[dict[str, Any], float]:
        """The arguments of one claim statement, and the time it is sent
        (the start of its leases' deadlines)."""
        specs = registry.specs()
        lease_kinds = [s.kind for s in specs if s.lease is not None]
        lease_secs = [float(s.lease) for s in specs if s.lease is not None]
        sent_at = time.monotonic()
        # Expired leases are looked for about once a second, not on every
        # claim: that scan reads every running job of the queues.
        reclaim = sent_at >= self._next_reclaim_scan
        if reclaim:
            self._next_reclaim_scan = sent_at + min(RECLAIM_SCAN_INTERVAL, self.settings.lease / 10)
        return {"queues": self.active_queues(), "batch": batch or self.settings.claim_size(with_async=False),
                "worker": self.name, "lease": float(self.settings.lease), "lease_kinds": lease_kinds,
                "lease_secs": lease_secs, "reclaim": reclaim, "kinds": kinds, "not_kinds": not_kinds}, sent_at

    def adopt(self, rows: list[store.Claimed], sent_at: float) -> list[Job]:
        """The jobs of a claim's rows, their leases tracked for the heartbeat
        (a reclaim the claim turned failed is counted, not returned)."""
        jobs = []
        claimed: dict[tuple[str, str], int] = {}
        waits: dict[tuple[str, str], list[float]] = {}
        now = time.time()
        for row in rows:
            job_id, queue, kind, attempt = row.id, row.queue, row.kind, row.attempt
            if row.prev_status == "running":
                metrics.RECLAIMS.labels(queue, kind).inc()
                self.stats.reclaimed += 1
            if row.status == "failed":
                log.warning("job %s (%s) attempt %s failed at claim: %s", job_id, errortext.one_line(kind), attempt,
                            errortext.first_line(row.last_error or ""))
                metrics.JOBS_FAILED.labels(queue, kind).inc()
                self.stats.add(FAILED)
                continue
            claimed[queue, kind] = claimed.get((queue, kind), 0) + 1
            self.stats.claimed += 1
            spec = registry.find(kind)
            seconds = (spec.lease if spec and spec.lease else self.settings.lease)
            # Deadline and claimed_at from the send time, here and in the
            # heartbeat's copy (which starts from claimed_at).
            lease = Lease(job_id, attempt, seconds, queue, kind,
                          deadline=sent_at + seconds, claimed_at=sent_at,
                          timeout=(spec.timeout if spec and spec.timeout else self.settings.timeout),
                          enforce_deadline=self.settings.renew)
            if self.heartbeat is not None and self.settings.renew:
                self.heartbeat.track(lease)
            waits.setdefault((queue, kind), []).append(max(0.0, now - row.run_at.timestamp()))
            jobs.append(self._make_job(row, lease))
        for (queue, kind), count in claimed.items():   # once per batch, not per job
            metrics.of(metrics.JOBS_CLAIMED, queue, kind).inc(count)
            metrics.observe_many(metrics.of(metrics.JOB_WAIT, queue, kind), waits[queue, kind])
        return jobs

    def _make_job(self, row: store.Claimed, lease: Lease) -> Job:
        """The Job a handler receives for a claimed row; it writes on this
        worker's connection."""
        return Job(row.id, row.kind, row.queue, row.attempt, RawJSON(row.payload), lease, row.max_attempts,
                   row.dedupe_key, conn=self.conn, fence=self.settings.fence)

    @contextlib.contextmanager
    def _conn_for(self, job: JobBase) -> Iterator[psycopg.Connection]:
        """The connection a write about ``job`` (its error report, its
        release, its put-back) goes on: the worker's own, or, in a worker
        that runs many jobs at once, one of its pool's for this write."""
        if self.pool is not None:
            with db.translated(self.dsn), pools.connection(self.pool) as conn:
                yield conn
            return
        yield self.conn

    @contextlib.contextmanager
    def _completion_conn(self) -> Iterator[psycopg.Connection]:
        """The connection batched completions go on: the worker's own."""
        yield self.conn

    # -- run one job ----------------------------------------------------------

    def run_job(self, job: Job, deferred: list[Job] | None = None) -> str:
        """Run one claimed job to its end and return the outcome.

        With ``deferred``, a job whose handler wrote nothing through
        ``fenced()`` is not completed here but appended to the list, still
        holding its lease, for :meth:`complete_deferred` to complete with
        others in one fenced statement.
        """
        if self.on_job:
            self.on_job(job)
        started = time.monotonic()
        outcome = None
        try:
            outcome = self._run(job, deferred)
        finally:
            if self.heartbeat is not None and outcome != DEFERRED:
                self.heartbeat.untrack(job.lease)
            elapsed = time.monotonic() - started
            if self._durations is not None:   # in a batch: observed together at its end
                self._durations.setdefault((job.queue, job.kind), []).append(elapsed)
            else:
                metrics.of(metrics.JOB_DURATION, job.queue, job.kind).observe(elapsed)
            if self.on_job:
                self.on_job(None)
        if outcome != DEFERRED:
            self.stats.add(outcome)
        return outcome

    def complete_deferred(self, jobs: list[Job]) -> int:
        """Complete many jobs in ONE statement, each fenced by its own
        ``(id, attempt)``; a job the fence refuses lost its lease like any
        other.  Returns how many were completed."""
        if not jobs:
            return 0
        ids, attempts = [j.id for j in jobs], [j.attempt for j in jobs]
        unavailable = False
        try:
            # A deadlock or serialization failure wrote nothing: run again at once.
            with self._completion_conn() as conn:
                done = db.retrying(lambda: store.complete_many(conn, ids, attempts),
                                   self.dsn, what="batched completion")
        except DatabaseError as exc:
            # Not known to be refused: the jobs stay running and are reclaimed
            # when their leases run out.
            log.warning("batched completion failed: %s", exc)
            self._forget_connection(exc)
            done, unavailable = set(), True
        refused = [] if unavailable else [job for job in jobs if job.id not in done]
        completed = self.settle(jobs, done, unavailable=unavailable)
        self.note_rejected(refused)
        return completed

    def settle(self, jobs: list[Job], done: set[int], *, unavailable: bool) -> int:
        """After a batched completion: the jobs in ``done`` are completed,
        the others lost (refused by the fence, or, when the database was
        ``unavailable``, not known to be completed); every lease untracked
        and ``jobs`` emptied.  Returns how many were completed."""
        completed: dict[tuple[str, str], int] = {}
        for job in jobs:
            if self.heartbeat is not None:
                self.heartbeat.untrack(job.lease)
            if job.id in done:
                job.completed = True
                completed[job.queue, job.kind] = completed.get((job.queue, job.kind), 0) + 1
                self.stats.add(DONE)
            else:
                if unavailable:
                    job.lease.mark_lost("renewal_failed")
                else:
                    job._rejected()
                self.stats.add(LOST)
        for (queue, kind), count in completed.items():   # once per batch, not per job
            metrics.of(metrics.JOBS_COMPLETED, queue, kind).inc(count)
        jobs.clear()
        return len(done)

    def _run(self, job: Job, deferred: list[Job] | None = None) -> str:
        spec = registry.find(job.kind)
        if spec is None:
            return self._put_back_unknown(job)
        try:
            self._start(job)
            result = spec.func(job)
            if inspect.isawaitable(result) and not job.completed:
                return self._refuse_awaitable(job, result)
            if not job.completed:
                if deferred is not None and job.fence:
                    deferred.append(job)
                    return DEFERRED
                with job.fenced():
                    pass
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            return self._after_error(job, exc)
        metrics.JOBS_COMPLETED.labels(job.queue, job.kind).inc()
        return DONE

    def _start(self, job: JobBase) -> None:
        """Just before the handler runs: a job that waited (behind others of
        its batch, for a thread) may have lost its lease meanwhile and is
        not started; its timeout counts from now, not from the claim."""
        job.check()
        job.lease.started_at = time.monotonic()
        if self.heartbeat is not None and self.settings.renew:
            self.heartbeat.handler_started(job.lease)

    def _after_error(self, job: JobBase, exc: Exception) -> str:
        """The outcome of a job whose handler (or completion) raised
        ``exc``: reported through the fence, retried or failed, or, for a
        lost lease, handed back or left to its new owner."""
        if isinstance(exc, LeaseLost):
            log.warning("job %s attempt %s lost its lease (%s); its writes were rolled back",
                        job.id, job.attempt, exc.reason)
            if exc.reason == "timeout":
                # Still ours in the database: report the overrun as an error
                # (fenced), so it is retried with backoff like any failure.
                return self._fail(job, f"timed out after {job.lease.timeout:g}s", final=False, outcome="timeout")
            if exc.reason == "fence_rejected":
                self.note_rejected([job])
            if exc.reason in ("renewal_failed", "expired"):
                # The database was out of reach, or nobody renewed the lease
                # in time; if nobody took the job meanwhile, hand it back now
                # rather than leave it to the reclaim scan.  A lease lost to
                # an outage is not the job's fault: if the database is still
                # out of reach, the release is tried again once it is back,
                # before the reclaim scan of a worker can count it against
                # max_reclaims.  The reason may be "expired" in an outage
                # too (the deadline passed while the renewal that was to fail
                # was still waiting for a connection): a release the
                # database does not answer is retried either way.
                self.release(job, retry_later=True, detail=f"lease lost ({exc.reason}): handed back")
            return LOST
        if isinstance(exc, PayloadRejected):
            return self._fail(job, f"payload rejected: {exc}", final=True, exc=exc)
        if isinstance(exc, PgfenceError):
            if isinstance(exc, DatabaseUnavailable) and self.pool is None:
                self._drop_connection()
            return self._fail(job, f"{type(exc).__name__}: {exc}", final=False, exc=exc)
        return self._fail(job, f"{type(exc).__name__}: {db.first_line(exc)}", final=False, exc=exc)

    def _refuse_awaitable(self, job: Job, result: object) -> str:
        """A handler returned a coroutine (or another awaitable) that nothing
        here would await: the work never ran, so the job fails instead of
        being completed.  An ``async def`` handler runs on the event loop;
        this catches a synchronous function that returns an awaitable."""
        close = getattr(result, "close", None)
        if callable(close):
            close()   # no "coroutine was never awaited" warning
        return self._fail(job, f"handler returned an awaitable ({type(result).__name__}) instead of running: "
                               "a def handler runs on a thread and nothing awaits what it returns; make it "
                               "async def", final=True)

    def _fail(self, job: JobBase, error: str, *, final: bool, exc: BaseException | None = None,
              outcome: str = "error") -> str:
        """Report a failed attempt through the fence (retry or fail), with
        the traceback of ``exc`` if given, recorded as ``outcome`` ("error"
        or "timeout") in the job's attempts, and log it at WARNING: kind,
        id, attempt and the error's first line, escaped (never the
        payload)."""
        # The text comes from the handler: made storable (no NUL, no lone
        # surrogate), or the report itself fails and the worker with it.
        error = errortext.storable(error)[:2000]
        traceback = errortext.storable(errortext.format_traceback(exc)) if exc is not None else None
        try:
            row = self._report_failure(job, error, traceback, final=final, outcome=outcome)
        except DatabaseError as exc:
            log.warning("job %s attempt %s: could not report its error (%s)", job.id, job.attempt, exc)
            self._forget_connection(exc)
            return LOST
        except Exception as exc:  # noqa: BLE001 - a handler's error must never kill its worker
            # Not reported: the job stays running and is reclaimed when its
            # lease runs out, and this worker goes on with the next one.
            log.error("job %s attempt %s: could not report its error: %s: %s", job.id, job.attempt,
                      type(exc).__name__, errortext.first_line(str(exc)))
            if self.pool is None:
                self._drop_connection()
            return LOST
        if row is None:
            # The fence refused a stale attempt's report: the job has a new
            # owner (or was cancelled) and its state must not be overwritten.
            metrics.DOUBLE_RUN_PREVENTED.labels(job.queue, job.kind).inc()
            job.lease.mark_lost("fence_rejected")
            return LOST
        if row.status == "failed":
            log.warning("job %s (%s) attempt %s failed for good (%s of %s attempts spent): %s",
                        job.id, errortext.one_line(job.kind), job.attempt, row.spent, row.max_attempts,
                        errortext.first_line(error))
            return FAILED
        log.warning("job %s (%s) attempt %s failed, retrying in %.2fs (%s of %s attempts spent): %s",
                    job.id, errortext.one_line(job.kind), job.attempt, row.delay, row.spent, row.max_attempts,
                    errortext.first_line(error))
        return RETRIED

    def _report_failure(self, job: JobBase, error: str, traceback: str | None, *,
                        final: bool, outcome: str = "error") -> store.Reported | None:
        """Run ``fail_or_retry``; should the server refuse the error text
        itself (a character the database encoding lacks, say), report the
        failure again with a plain text instead, so the attempt is still
        counted and the job retried or failed."""
        def report(error: str, traceback: str | None) -> store.Reported | None:
            with self._conn_for(job) as conn:
                return db.retrying(lambda: store.fail_or_retry(conn, job.id, job.attempt, error=error,
                                                               traceback=traceback, final=final,
                                                               backoff=self.retry_backoff, outcome=outcome),
                                   self.dsn, what="error report")

        try:
            return report(error, traceback)
        except (DatabaseUnavailable, TransactionConflict):
            raise
        except (PgfenceError, psycopg.DataError) as exc:
            log.warning("job %s attempt %s: its error text was refused (%s); reporting it without the text",
                        job.id, job.attempt, errortext.first_line(str(exc)))
            return report("the handler's error message could not be stored", None)

    def _put_back_unknown(self, job: JobBase) -> str:
        """Hand back (fenced) a job whose kind this worker does not know,
        to be claimed again ``unknown_kind_delay`` seconds later, by a worker
        that may know it; no attempt is spent.  Once the job is older than
        ``unknown_kind_timeout`` it is failed instead."""
        known = ", ".join(registry.kinds()) or "none"
        error = (f"unknown job kind {job.kind!r}: no worker that claimed it knew it within "
                 f"{self.settings.unknown_kind_timeout:g}s of its creation (known here: {known})")
        try:
            with self._conn_for(job) as conn:
                status = db.retrying(lambda: store.put_back_unknown(conn, job.id, job.attempt,
                                                                    delay=self.settings.unknown_kind_delay,
                                                                    give_up=self.settings.unknown_kind_timeout,
                                                                    error=error[:2000]),
                                     self.dsn, what="put-back")
        except DatabaseError as exc:
            # Not known to be handed back: reclaimed once its lease runs out.
            log.warning("job %s attempt %s: could not put it back (%s)", job.id, job.attempt, exc)
            self._forget_connection(exc)
            return LOST
        if status is None:
            metrics.DOUBLE_RUN_PREVENTED.labels(job.queue, job.kind).inc()
            job.lease.mark_lost("fence_rejected")
            return LOST
        metrics.of(metrics.UNKNOWN_KIND, job.queue, job.kind).inc()
        if status == "failed":
            log.warning("job %s (%s) attempt %s failed for good: %s", job.id, errortext.one_line(job.kind),
                        job.attempt, errortext.first_line(error))
            metrics.JOBS_FAILED.labels(job.queue, job.kind).inc()
            return FAILED
        if job.kind not in self._unknown_logged:
            self._unknown_logged.add(job.kind)
            log.warning("worker %s does not know job kind %s (queue %s): putting its jobs back for %gs "
                        "each, for a worker that knows it, until they are %gs old (logged once per kind)",
                        self.name, errortext.one_line(job.kind), errortext.one_line(job.queue),
                        self.settings.unknown_kind_delay, self.settings.unknown_kind_timeout)
        return PUT_BACK

    def release(self, job: JobBase, *, reclaim: bool = False, reason: str | None = None,
                retry_later: bool = False, detail: str | None = None) -> bool:
        """Hand a claimed job back to the queue (fenced); True if it was still
        ours.  ``detail`` says why in the job's attempts (released).  With
        ``retry_later``, a release the database did not answer is tried
        again at the start of the next claim round."""
        if self.heartbeat is not None:
            self.heartbeat.untrack(job.lease)
        try:
            with self._conn_for(job) as conn:
                released = db.retrying(lambda: store.release(conn, job.id, job.attempt, reclaim=reclaim,
                                                             reason=reason, detail=detail),
                                       self.dsn, what="release")
        except DatabaseError as exc:
            log.warning("job %s attempt %s: could not release it (%s)%s", job.id, job.attempt, exc,
                        "; trying again once the database answers" if retry_later else "")
            self._forget_connection(exc)
            if retry_later:
                self._unreleased.append(job)
            return False
        return released is not None

    def note_rejected(self, jobs: list[JobBase] | list[Job]) -> None:
        """Record in the jobs' attempts that the fence refused the completion
        of ``jobs`` (one small insert, after their transactions were rolled
        back).  A failure is logged, not raised: the fence did its work, and
        only the record for operators is missing."""
        if not jobs:
            return
        now = time.monotonic()
        ran = [now - (job.lease.started_at or job.lease.claimed_at) for job in jobs]
        try:
            with self._conn_for(jobs[0]) as conn, db.translated(self.dsn):
                store.note_fence_rejected(conn, [job.id for job in jobs], [job.attempt for job in jobs], ran,
                                          worker=self.name)
        except DatabaseError as exc:
            log.warning("could not record the refused completion of %d job(s): %s", len(jobs), exc)
            self._forget_connection(exc)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _forget_connection(self, exc: PgfenceError) -> None:
        """After a failed statement: a broken connection is dropped (the
        next use reconnects); one that only had a statement refused is kept.
        In a worker with a pool the pool checks its own connections, and the
        worker's own belongs to the thread that claims: left alone here."""
        if threading.current_thread() is not self._owner:
            return
        if isinstance(exc, DatabaseUnavailable) or (self._conn is not None and self._conn.closed):
            self._drop_connection()

    # -- the loop ---------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; the job running now is finished first."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _release_unreleased(self) -> None:
        """Release the jobs whose leases an outage lost, now that the
        database answers; DatabaseUnavailable while any is left."""
        pending, self._unreleased = self._unreleased, []
        for job in pending:
            if self.release(job, retry_later=True, detail="lease lost to an outage: handed back once the "
                                                          "database answered"):
                log.info("job %s attempt %s released after the outage that lost its lease", job.id, job.attempt)
        if self._unreleased:
            # Not released yet: no claim before, or this worker's own reclaim
            # scan could take the job back as a reclaim the moment the
            # database answers again, and count it against max_reclaims.
            raise DatabaseUnavailable(f"{len(self._unreleased)} job(s) whose lease an outage lost are still to be "
                                      "released; claiming after that")

    def run_once(self) -> int:
        """Claim one batch and run it; return how many jobs were claimed.

        In a batch, jobs whose handlers wrote nothing are completed together
        in one fenced statement, at the end of the batch or, between jobs,
        once the oldest has waited ``DEFER_MAX`` seconds.  Their leases stay
        held (and renewed) until then, so the wait costs latency, never
        safety; batches are for quick jobs.
        """
        self._release_unreleased()
        # Each claim first reads the notifications received so far (see
        # claim): unread, psycopg would keep them all (one per enqueue in any
        # queue) as long as the worker stays busy.
        jobs = self.claim()
        deferred: list[Job] = []
        oldest = 0.0
        self._durations = {}
        try:
            for index, job in enumerate(jobs):
                # Asked to stop: the job in hand runs, the rest go back.
                if self.stopping and index > 0:
                    for rest in jobs[index:]:
                        if self.release(rest, detail="released at shutdown before it started"):
                            self.stats.add(RELEASED)
                    break
                # A batch of one is deferred too: complete_many is then one
                # autocommit statement instead of BEGIN, complete, COMMIT.
                in_flight = metrics.of(metrics.JOBS_IN_FLIGHT, job.queue)
                in_flight.inc()
                metrics.WORKER_FREE_SLOTS.set(0)
                try:
                    outcome = self.run_job(job, deferred)
                finally:
                    in_flight.dec()
                    metrics.WORKER_FREE_SLOTS.set(1)
                if outcome == DEFERRED and len(deferred) == 1:
                    oldest = time.monotonic()
                if deferred and time.monotonic() - oldest >= DEFER_MAX:
                    self.complete_deferred(deferred)
        finally:
            try:
                self.complete_deferred(deferred)
            finally:
                durations, self._durations = self._durations, None
                for (queue, kind), values in durations.items():
                    metrics.observe_many(metrics.of(metrics.JOB_DURATION, queue, kind), values)
        return len(jobs)

    def run(self, *, burst: bool = False, max_jobs: int | None = None,
            enough: Callable[[], bool] | None = None) -> Stats:
        """Work until asked to stop (or, with ``burst``, until the queue is
        empty, or until ``max_jobs`` jobs have run).  ``enough`` is asked
        after each claim that ran a job, never while a job is held: true ends
        the loop as ``max_jobs`` does (a child's memory limit)."""
        self._owner = threading.current_thread()
        if self._own is not None:
            self._own.start()
        # One job at a time: its slot is free between jobs (the gauges'
        # saturation reads in flight / capacity).
        metrics.WORKER_CAPACITY.set(1)
        metrics.WORKER_FREE_SLOTS.set(1)
        try:
            while not self.stopping:
                try:
                    claimed = self.run_once()
                except DatabaseError as exc:
                    # Unreachable, or a claim refused (a statement timeout, a
                    # conflict): wait, then claim again.
                    log.warning("%s", exc)
                    self._forget_connection(exc)
                    self._stop.wait(self.settings.poll_interval)
                    continue
                self._maybe_prune()
                # Put-backs ran nothing: they do not count as jobs.
                if max_jobs is not None and sum(n for outcome, n in self.stats.outcomes.items()
                                                if outcome != PUT_BACK) >= max_jobs:
                    break
                if claimed and enough is not None and enough():
                    break
                if claimed == 0:
                    if burst:
                        break
                    self._wait_for_work()
        finally:
            metrics.WORKER_CAPACITY.set(0)
            metrics.WORKER_FREE_SLOTS.set(0)
            self.close()
        return self.stats

    def idle_wait(self) -> float:
        """Seconds an idle worker may sleep: until the earliest run_at still
        to come among its queues' jobs (a delayed job, a retry's backoff) or
        the earliest lease still to run out among their running jobs (a job
        whose worker may have died), at most the poll interval.  When a lease
        end comes first, the claim after the sleep looks for expired leases
        whatever the reclaim scan's interval."""
        # An idle wake reads the pauses again (a NOTIFY can be missed: no
        # LISTEN behind PgBouncer, a connection replaced).
        self._pauses_stale = True
        queues = self.active_queues()
        try:
            with db.translated(self.dsn):
                until = store.next_run_at(self.conn, queues)
                lease_end = store.next_lease_end(self.conn, queues)
        except DatabaseError as exc:
            log.warning("worker %s cannot look up the next run_at: %s", self.name, exc)
            self._forget_connection(exc)
            return self.settings.poll_interval
        wait = self.settings.poll_interval
        if until is not None:
            wait = min(wait, until + RUN_AT_MARGIN)
        if lease_end is not None and lease_end + RUN_AT_MARGIN < wait:
            wait = lease_end + RUN_AT_MARGIN
            self._next_reclaim_scan = min(self._next_reclaim_scan, time.monotonic() + wait)
        log.debug("worker %s idle: next run_at in %s, next lease end in %s, sleeping up to %.3fs", self.name,
                  "none" if until is None else f"{until:.3f}s",
                  "none" if lease_end is None else f"{lease_end:.3f}s", wait)
        return wait

    def _drain_notifies(self) -> int:
        """Read and drop the notifications received so far (psycopg's
        backlog and any waiting on the socket); returns how many.

        No wake-up is lost: only a claim that found nothing is followed by a
        wait, and a notification read here came from an enqueue committed
        before the next claim starts, so that claim sees the job.  One that
        arrives during that claim stays in the backlog and ends the wait at
        once."""
        if not self._listening or self._conn is None or self._conn.closed:
            return 0
        try:
            notes = list(self._conn.notifies(timeout=0))
            self._woken(notes)   # a pause or resume among them makes the pauses stale
            return len(notes)
        except (psycopg.Error, OSError):
            self._drop_connection()
            return 0

    def _wait_for_work(self) -> None:
        """Sleep until the next run_at comes, a NOTIFY from an enqueue, the
        poll interval, or a stop, whichever is first."""
        wait = self.idle_wait()
        if not self.settings.listen:
            self._stop.wait(wait)
            return
        try:
            conn = self.conn
            if not self._listening:
                self._listen(conn)
                self._listening = True
            deadline = time.monotonic() + wait
            while not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # Short slices keep a stop request prompt.
                woken = self._woken(list(conn.notifies(timeout=min(left, 0.25))))
                if woken:
                    # The claim that follows sees every enqueue notified so
                    # far: the rest would each cost a claim for nothing.
                    self._drain_notifies()
                    return
        except (psycopg.Error, OSError):
            self._drop_connection()
            self._stop.wait(min(1.0, self.settings.poll_interval))

    def _maybe_prune(self) -> None:
        # History's partitions are created ahead even when retention is off
        # (none), so that completions never land in the default partition.
        if time.monotonic() - self._last_prune < self.settings.prune_interval:
            return
        self._last_prune = time.monotonic()
        try:
            retention.maintain(self.conn, self.settings.retention)
        except PgfenceError as exc:
            log.warning("history maintenance failed: %s", exc)
