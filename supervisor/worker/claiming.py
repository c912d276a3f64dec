"""How a worker finds its jobs: its own connection (LISTEN for enqueues and
pauses), the claim statement (sized by the engine to its free slots, with
expired leases reclaimed about once a second), the leases of what it
claimed, and the one idle wait of every mode.

The idle wait: a worker whose claims found nothing sleeps until the first of
an enqueue's NOTIFY into one of its queues (or a pause or resume), a job's
end in one of its slots, the next due ``run_at`` among its queues' jobs, the
earliest lease still to run out among their running jobs (the claim after
that wake looks for expired leases), the poll interval, or a stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from pgfence import errortext, registry
from pgfence.errors import DatabaseError, DatabaseUnavailable, PgfenceError
from pgfence.job import JobBase
from pgfence.observe import metrics
from pgfence.store import db, operations, renewals
from pgfence.store import jobs as store
from pgfence.store import limits as limits_store
from pgfence.worker import retention
from pgfence.worker.lease import Lease
from pgfence.worker.outcomes import FAILED, Outcomes
from pgfence.worker.wake import Wake

log = logging.getLogger("pgfence.worker")

#: At most this many seconds (or a tenth of the lease) between two claim
#: rounds of a worker that also look for expired leases; the claims in
#: between read queued jobs alone.
RECLAIM_SCAN_INTERVAL = 1.0
#: An idle worker that sleeps until the next run_at wakes this much later,
#: so that the job is due by the database clock when the claim looks.
RUN_AT_MARGIN = 0.005
#: At most this many seconds between two admissions by time (admit_due) of
#: a busy worker.
ADMIT_INTERVAL = 0.25
#: Longest slice of an idle wait: a stop request is seen at least this often.
WAIT_SLICE = 0.25


@dataclass(frozen=True)
class Claim:
    """One claim to try: up to ``size`` jobs, of ``kinds`` only (None: any)
    or of every kind but ``not_kinds``, for the loop's slots (``on_loop``)
    or the others."""

    size: int
    kinds: list[str] | None = None
    not_kinds: list[str] | None = None
    on_loop: bool = False


class Claiming(Outcomes):
    """The engine's part that claims (see the module's docstring)."""

    _stop: threading.Event
    _wake: Wake
    _conn: psycopg.Connection | None
    _listening: bool
    _owner: threading.Thread
    _next_reclaim_scan: float
    #: When this worker last admitted held jobs by time (monotonic).
    _admitted_at: float = 0.0
    _last_prune: float
    paused: frozenset[str]
    notes_before_claim: int
    _pauses_stale: bool
    _pauses_read_at: float
    #: The most jobs one claim statement takes.
    claim_size: int

    def _make_job(self, row: store.Claimed, lease: Lease) -> JobBase:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

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

    # -- claim ----------------------------------------------------------------

    def claim(self, batch: int | None = None, kinds: list[str] | None = None,
              not_kinds: list[str] | None = None, *, reclaim: bool | None = None) -> list[JobBase]:
        """Claim up to ``batch`` jobs (of ``kinds`` only, or of every kind but
        ``not_kinds``, if given); return those to run (a reclaim past its
        budget comes back failed and is not returned).  ``reclaim``: whether
        the claim also takes expired leases (None: when the scan is due)."""
        # A pause notified while this worker was busy is read here, with
        # the enqueues' notifications, which the claim below makes moot
        # (it sees every job they announced).
        self.notes_before_claim = self._drain_notifies()
        self.refresh_pauses()
        args, sent_at = self.claim_args(batch, kinds, not_kinds, reclaim=reclaim)
        with db.translated(self.dsn):
            now = time.monotonic()
            if now - self._admitted_at >= ADMIT_INTERVAL:
                # Held jobs whose run_at came, or whose kind's rate lets
                # more start, are admitted (a rate's burst is a second's
                # worth: rounds this often lose none of it).
                self._admitted_at = now
                limits_store.admit_due(self.conn)
            rows = store.claim(self.conn, **args)
        return self.adopt(rows, sent_at)

    def reclaim_due(self) -> bool:
        """Whether the claims of this round also look for expired leases:
        about once a second, not on every claim, since that scan reads every
        running job of the queues.  Asked once per round, and every claim of
        the round (one per slot kind) then scans its own kinds: a scan is
        never spent by one kind's claim while another kind's leases expire."""
        now = time.monotonic()
        if now < self._next_reclaim_scan:
            return False
        self._next_reclaim_scan = now + min(RECLAIM_SCAN_INTERVAL, self.settings.lease / 10)
        return True

    def claim_args(self, batch: int | None, kinds: list[str] | None,
                   not_kinds: list[str] | None, *, reclaim: bool | None = None) -> tuple[dict[str, Any], float]:
        """The arguments of one claim statement, and the time it is sent
        (the start of its leases' deadlines)."""
        specs = registry.specs()
        lease_kinds = [s.kind for s in specs if s.lease is not None]
        lease_secs = [float(s.lease) for s in specs if s.lease is not None]
        if reclaim is None:
            reclaim = self.reclaim_due()
        sent_at = time.monotonic()
        return {"queues": self.active_queues(), "batch": batch or self.claim_size,
                "worker": self.name, "lease": float(self.settings.lease), "lease_kinds": lease_kinds,
                "lease_secs": lease_secs, "reclaim": reclaim, "kinds": kinds, "not_kinds": not_kinds}, sent_at

    def adopt(self, rows: list[store.Claimed], sent_at: float) -> list[JobBase]:
        """The jobs of a claim's rows, their leases tracked for the heartbeat
        (a reclaim the claim turned failed is counted, not returned)."""
        jobs: list[JobBase] = []
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
                limits_store.admit_due(self.conn)
                until = store.next_run_at(self.conn, queues)
                rate_at = limits_store.next_rate_at(self.conn)
                if rate_at is not None:
                    until = rate_at if until is None else min(until, rate_at)
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

    def wait_for_work(self, seconds: float) -> bool:
        """The idle wait (see the module's docstring), at most ``seconds``
        and at most one slice; True when an enqueue or a pause woke it (the
        claim that follows sees every enqueue notified so far)."""
        seconds = min(seconds, WAIT_SLICE)
        if not self.settings.listen or self.stopping:
            self._wake.wait(seconds)
            self._wake.clear()
            return False
        try:
            conn = self.conn
            if not self._listening:
                self._listen(conn)
                self._listening = True
            notes = list(conn.notifies(timeout=0))
            if not notes:
                self._wake.wait_along(conn.fileno(), seconds)
                self._wake.clear()
                notes = list(conn.notifies(timeout=0))
            woken = self._woken(notes)
        except (psycopg.Error, OSError, DatabaseError):
            self._drop_connection()
            self._stop.wait(min(1.0, self.settings.poll_interval))
            return False
        if woken:
            self._drain_notifies()
        return woken
