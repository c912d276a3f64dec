"""How a claimed job ends: its handler run on the calling thread, and every
write that ends an attempt through the fence (the error report that retries
or fails it, the release that hands it back, the put-back of an unknown
kind) and the record of each write the fence refused.

Every slot kind runs a job's end through these methods: the one-job slot and
the threads on their own thread, the event loop on a reporting thread (the
writes are synchronous)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg

from pgfence import errortext, registry, results
from pgfence.backoff import Backoff
from pgfence.errors import (DatabaseError, DatabaseUnavailable, LeaseLost, PayloadRejected, PgfenceError,
                            RateLimited, ResultRejected, TransactionConflict)
from pgfence.job import Job, JobBase
from pgfence.observe import metrics
from pgfence.settings import Settings
from pgfence.store import db, pools
from pgfence.store import jobs as store
from pgfence.worker.lease import LeaseTracker
from pgfence.worker.stats import DEFERRED, DONE, FAILED, LOST, PUT_BACK, RATE_LIMITED, RELEASED, RETRIED, Stats

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger("pgfence.worker")

#: Re-exported: the outcomes' names and the counts (pgfence.worker.stats).
__all__ = ["DEFERRED", "DONE", "FAILED", "LOST", "PUT_BACK", "RATE_LIMITED", "RELEASED", "RETRIED", "Outcomes",
           "Stats"]


class Outcomes:
    """The engine's part that ends attempts (see the module's docstring)."""

    dsn: str
    name: str
    settings: Settings
    stats: Stats
    retry_backoff: Backoff
    heartbeat: LeaseTracker | None
    pool: ConnectionPool | None
    #: Handler run times of the batch in hand, observed at its end.
    _durations: dict[tuple[str, str], list[float]] | None
    _unknown_logged: set[str]
    _unreleased: list[JobBase]
    #: Refusals whose record could not be written (the database was out of
    #: reach): written once it answers, so every counted refusal has its row.
    _unrecorded: list[tuple[list[JobBase], str, list[float]]]

    @property
    def conn(self) -> psycopg.Connection:
        raise NotImplementedError

    def _drop_connection(self) -> None:
        raise NotImplementedError

    def _forget_connection(self, exc: PgfenceError) -> None:
        raise NotImplementedError

    def _refused(self, job: JobBase, what: str) -> None:
        """The fence refused ``what`` of ``job``'s attempt (its error report,
        its put-back): counted, and recorded in its attempts, as a refused
        completion is."""
        metrics.DOUBLE_RUN_PREVENTED.labels(job.queue, job.kind).inc()
        job.lease.mark_lost("fence_rejected")
        self.note_rejected([job], what)

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

    def run_job(self, job: Job, deferred: list[Job] | None = None) -> str:
        """Run one claimed job to its end and return the outcome.

        With ``deferred``, a job whose handler wrote nothing through
        ``fenced()`` is not completed here but appended to the list, still
        holding its lease, for :meth:`complete_deferred` to complete with
        others in one fenced statement.
        """
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
        if outcome != DEFERRED:
            self.stats.add(outcome)
        return outcome


    def _run(self, job: Job, deferred: list[Job] | None = None) -> str:
        spec = registry.find(job.kind)
        if spec is None:
            return self._put_back_unknown(job)
        try:
            self._start(job)
            result = spec.func(job)
            if inspect.isawaitable(result) and not job.completed:
                return self._refuse_awaitable(job, result)
            if job.completed:
                self._keep_result(job, result, spec.store_result)
            else:
                job._result = results.encode(result, store=spec.store_result)
                if deferred is not None and job.fence:
                    deferred.append(job)
                    return DEFERRED
                with job.fenced():
                    pass
        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
            return self._after_error(job, exc)
        metrics.JOBS_COMPLETED.labels(job.queue, job.kind).inc()
        return DONE

    @staticmethod
    def _keep_result(job: Job, value: object, store: bool) -> None:
        """A job its handler's own fenced block completed: its result, on
        its history row after.  One that cannot be stored is logged; the job
        stays done."""
        try:
            job._result = results.encode(value, store=store)
            if job._result is not None:
                job.store_result()
        except PgfenceError as exc:
            log.warning("job %s is done, but its result was not stored: %s", job.id, exc)

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
        if isinstance(exc, RateLimited):
            return self._rate_limited(job, exc)
        if isinstance(exc, PayloadRejected):
            return self._fail(job, f"payload rejected: {exc}", final=True, exc=exc)
        if isinstance(exc, ResultRejected):
            return self._fail(job, f"result rejected: {exc}", final=True, exc=exc)
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
            self._refused(job, "error report")
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
            self._refused(job, "put-back")
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

    def _rate_limited(self, job: JobBase, exc: RateLimited) -> str:
        """Hand back (fenced) a job whose handler raised RateLimited: queued
        again ``retry_after`` seconds later, no attempt spent, and its kind's
        rate (if any) closed until then."""
        detail = errortext.first_line(str(exc))[:2000]
        try:
            with self._conn_for(job) as conn:
                back = db.retrying(lambda: store.rate_limited(conn, job.id, job.attempt, delay=exc.retry_after,
                                                              detail=detail), self.dsn, what="put-back")
        except DatabaseError as err:
            log.warning("job %s attempt %s: could not put it back (%s)", job.id, job.attempt, err)
            self._forget_connection(err)
            return LOST
        if not back:
            self._refused(job, "put-back")
            return LOST
        log.info("job %s (%s) attempt %s %s", job.id, errortext.one_line(job.kind), job.attempt, detail)
        metrics.of(metrics.RATE_LIMITED, job.queue, job.kind).inc()
        return RATE_LIMITED

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

    def note_rejected(self, jobs: list[JobBase] | list[Job], what: str = "completion") -> None:
        """Record in the jobs' attempts that the fence refused ``what`` of
        ``jobs`` (their completion, after their transactions were rolled back;
        an error report; a put-back), in one small insert.  A failure is
        logged, not raised: the fence did its work, and the record is written
        once the database answers again (before the next claim)."""
        if not jobs:
            return
        now = time.monotonic()
        ran = [now - (job.lease.started_at or job.lease.claimed_at) for job in jobs]
        self._record_rejected(list(jobs), what, ran)

    def _record_rejected(self, jobs: list[JobBase], what: str, ran: list[float]) -> bool:
        try:
            with self._conn_for(jobs[0]) as conn, db.translated(self.dsn):
                store.note_fence_rejected(conn, [job.id for job in jobs], [job.attempt for job in jobs], ran,
                                          worker=self.name, what=what)
        except DatabaseError as exc:
            log.warning("could not record the refused %s of %d job(s) yet: %s", what, len(jobs), exc)
            self._forget_connection(exc)
            self._unrecorded.append((jobs, what, ran))
            return False
        return True

    def record_unrecorded(self) -> None:
        """Write the refusals an outage kept from their records (also once
        more as the worker ends)."""
        unrecorded, self._unrecorded = self._unrecorded, []
        for i, (jobs, what, ran) in enumerate(unrecorded):
            # The insert ignores a row already there, so a retry never doubles one.
            if not self._record_rejected(jobs, what, ran):
                self._unrecorded.extend(unrecorded[i + 1:])   # still out of reach: the rest wait too
                return

    def _release_unreleased(self) -> None:
        """Release the jobs whose leases an outage lost, now that the
        database answers, and write the refusals an outage kept unrecorded;
        DatabaseUnavailable while any job is left."""
        self.record_unrecorded()
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
