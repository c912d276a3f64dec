"""The heartbeat manager: renews the leases of many running jobs in ONE
statement per round.

Each lease is renewed once a third of its own length has passed since its
last renewal (or every ``heartbeat`` seconds when that is configured and
shorter than the lease): a kind with a short lease is renewed at its own
pace, and a round renews, in one statement, every lease due before the next
round.  It learns per job which renewals were rejected (the attempt no longer
owns the job, or the job was cancelled) and marks those leases lost; a lease
whose local deadline passes is marked lost too (see :mod:`supervisor.lease`),
as ``renewal_failed`` after a failed renewal, else ``expired``.

A job that runs past its kind's timeout is marked lost (``timeout``) at that
moment, so its handler's ``check()`` raises, but it is still renewed for
``timeout_grace`` seconds more: nobody else may claim it while its worker
finishes the attempt or is killed (``lost_lease_kill_after``).

A plain object with :meth:`run_once`; :meth:`start` runs it in a thread of
an in-process worker, the supervisor in a process of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from pgfence.backoff import Backoff
from pgfence.store import db, jobs, pools, renewals
from pgfence.observe import metrics
from pgfence.errors import ConfigError
from pgfence.worker.lease import Lease
from pgfence.settings import idle_in_transaction_ms

log = logging.getLogger("pgfence.heartbeat")


@dataclass
class RenewResult:
    """What one round did."""

    sent: int = 0            # leases in the renewal statement (0: no statement)
    renewed: int = 0
    lost: dict[str, int] = field(default_factory=dict)   # reason -> count
    error: str | None = None  # the database error of this round, if any

    def add_lost(self, reason: str) -> None:
        self.lost[reason] = self.lost.get(reason, 0) + 1


def renew_period(lease: float, heartbeat: float | None) -> float:
    """Seconds between two renewals of a lease of ``lease`` seconds: the
    configured ``heartbeat`` when it is shorter than the lease, else a third
    of the lease."""
    if heartbeat is not None and heartbeat < lease:
        return heartbeat
    return lease / 3


def validate_heartbeat(heartbeat: float | None, specs: Iterable[Any]) -> None:
    """Refuse a configured ``heartbeat`` longer than half a kind's lease:
    one late round would lose every lease of that kind.  Unset, the
    renewals follow each lease (a third of it) and nothing is refused."""
    if heartbeat is None:
        return
    for spec in specs:
        if spec.lease is not None and heartbeat > spec.lease / 2:
            raise ConfigError(f"invalid heartbeat: {heartbeat:g}s cannot keep the {spec.lease:g}s lease of "
                              f"kind {spec.kind!r}; give at most half of it ({spec.lease / 2:g}s), or leave "
                              "heartbeat unset to renew each lease when a third of it has passed")


class HeartbeatManager:
    """Renews every tracked lease in one batched statement per round.

    ``interval`` is the configured ``heartbeat`` (None: a third of each
    lease); ``self.interval`` is the period of a ``default_lease`` lease,
    the longest a running thread waits between two rounds.  A timed-out
    lease is renewed ``timeout_grace`` seconds past its timeout.
    ``backoff`` is the retry policy of the attempts it reports failed (the
    workers' own; None: the settings' defaults).  ``statements`` counts the
    renewal statements sent.
    """

    def __init__(self, dsn: str, *, default_lease: float = 30.0, interval: float | None = None,
                 timeout_grace: float = 0.0, application_name: str = "pgfence heartbeat",
                 prepare: bool = False, idle_in_transaction_timeout: float | None = 60.0,
                 backoff: Backoff | None = None):
        if default_lease <= 0:
            raise ValueError("default_lease must be positive")
        if interval is not None and interval <= 0:
            raise ValueError("interval must be positive")
        self.dsn = dsn
        self.default_lease = default_lease
        self.heartbeat = interval
        self.interval = renew_period(default_lease, interval)
        self.timeout_grace = timeout_grace
        #: The retry backoff of the attempts this manager reports failed
        #: (a worker killed past its timeout): the workers' own policy.
        self.backoff = Backoff() if backoff is None else backoff
        #: idle_in_transaction_session_timeout of this manager's sessions and
        #: renewals, in milliseconds ('0': the server's).
        self.idle_in_transaction_ms = idle_in_transaction_ms(idle_in_transaction_timeout)
        self.statements = 0
        self._leases: dict[tuple[int, int], Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Set by stop(), and by track() when a new lease is due before the
        # round the thread waits for.
        self._wake = threading.Event()
        self._next_at = 0.0
        # After a failed round, no new one before this (monotonic): a lease
        # due in the past must not make the loops retry without a pause.
        self._retry_at = 0.0
        # When the last renewal statement was sent (monotonic): the next
        # renews no lease sooner than one of its periods later (see
        # next_event).
        self._last_sent = float("-inf")
        self._thread: threading.Thread | None = None
        # A renewal statement lives at most its leases' shortest period.
        # A round starved of a connection makes the pool try again at once
        # (see pools.Reconnecting): the first round after an outage renews.
        self._pool = pools.Reconnecting(lambda: ConnectionPool(
            db.conninfo(dsn, application_name=application_name),
            min_size=1, max_size=1, open=False, timeout=max(1.0, self.interval),
            kwargs={"autocommit": True, "prepare_threshold": db.prepare_threshold(prepare)},
            configure=self._configure,
            reconnect_timeout=3600 * 24 * 365,
            name="pgfence-heartbeat",
        ))

    def _configure(self, conn: psycopg.Connection) -> None:
        """Each new connection of the pool: see session_settings."""
        renewals.session_settings(conn, self.idle_in_transaction_ms)

    # -- tracking ---------------------------------------------------------

    def track(self, lease: Lease) -> None:
        with self._lock:
            self._leases[(lease.id, lease.attempt)] = lease
        if self._thread is not None and self.next_event(lease) < self._next_at:
            self._wake.set()

    def untrack(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop((lease.id, lease.attempt), None)

    def handler_started(self, lease: Lease) -> None:
        """The handler of ``lease``'s job started (``lease.started_at`` is
        set): its timeout may fall before the round the thread waits for."""
        if self._thread is not None and self.next_event(lease) < self._next_at:
            self._wake.set()

    def tracked(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    # -- one round --------------------------------------------------------

    def period(self, lease: Lease) -> float:
        """Seconds between two renewals of ``lease``."""
        return renew_period(lease.seconds, self.heartbeat)

    def due(self, lease: Lease) -> float:
        """When ``lease`` should be renewed next (monotonic)."""
        return lease.renewed_at + self.period(lease)

    def holding(self, lease: Lease, now: float) -> bool:
        """A timed-out lease is still renewed within the grace after its
        timeout, until its deadline passes."""
        return (lease.timeout is not None and lease.started_at is not None
                and now < lease.started_at + lease.timeout + self.timeout_grace and not lease.expired(now))

    def next_event(self, lease: Lease) -> float:
        """When ``lease`` next needs a round: its renewal, or its timeout.

        A lease's renewal falls due a period after its claim was sent, but
        the lease is seen only once the claim has returned (a claim of many
        jobs on a loaded machine takes a good part of a period): one claimed
        just before a round and seen just after it would call the next round
        early, and with claims coming all the time every round would come
        early.  So a renewal waits until one period after the last
        statement, unless that would leave the lease less than one period
        before its deadline; its timeout never waits."""
        at = max(self.due(lease), min(self._last_sent + self.period(lease), lease.deadline - self.period(lease)))
        if lease.timeout is not None and lease.started_at is not None and lease.lost_reason is None:
            at = min(at, lease.started_at + lease.timeout)
        return at

    def next_round(self, leases: list[Lease], now: float) -> float:
        """When the next round is needed for ``leases``: the earliest renewal
        or timeout among them, at most one ``interval`` away."""
        at = now + self.interval
        for lease in leases:
            if lease.lost_reason is None or (lease.lost_reason == "timeout" and self.holding(lease, now)):
                at = min(at, self.next_event(lease))
        return max(at, self._retry_at)

    def renewal_idle_ms(self, leases: list[Lease]) -> str:
        """A renewal's idle-in-transaction timeout (ms): its window, or the
        session's if shorter.  A manager frozen before its COMMIT holds the
        rows locked, which reclaims skip (the session's 60s was too long)."""
        window_ms = max(100, int(self.window(leases) * 1000))
        own = int(self.idle_in_transaction_ms)
        return str(window_ms if own == 0 else min(own, window_ms))

    def window(self, leases: list[Lease]) -> float:
        """How far ahead a round renews: the shortest period among ``leases``
        (a lease due before the next round goes in this one)."""
        return min([self.period(lease) for lease in leases] or [self.interval])

    def run_once(self, leases: list[Lease] | None = None, *, horizon: float | None = None) -> RenewResult:
        """Renew all held leases (or ``leases``) in one statement; return what
        happened.  With ``horizon`` only those due by then are renewed."""
        result = RenewResult()
        now = time.monotonic()
        live: list[Lease] = []
        for lease in (self.tracked() if leases is None else leases):
            if lease.lost_reason is not None and lease.lost_reason != "timeout":
                continue
            if lease.timed_out(now):
                if lease.mark_lost("timeout"):
                    result.add_lost("timeout")
                if not self.holding(lease, now):
                    continue
            elif lease.expired(now):
                reason = lease.expiry_reason()
                if lease.mark_lost(reason):
                    result.add_lost(reason)
                continue
            if horizon is not None and self.due(lease) > horizon:
                continue
            live.append(lease)
        if not live:
            return result
        result.sent = len(live)
        ids = [lease.id for lease in live]
        attempts = [lease.attempt for lease in live]
        seconds = [float(lease.seconds) for lease in live]
        sent_at = self._last_sent = time.monotonic()
        wait = max(0.1, min(self._pool.pool.timeout, self.window(live)))

        def renew() -> tuple[set[tuple[int, int]], dict[int, renewals.Verdict]]:
            # Not waiting for a connection longer than the leases' period either.
            with self._pool.connection(wait) as conn, conn.transaction():
                # Settings for this transaction only: a startup option or
                # a session SET would not survive (or would leak through)
                # a transaction-pooling PgBouncer.
                renewals.renewal_settings(conn, statement_ms=str(max(100, int(self.window(live) * 1000))),
                                        idle_ms=self.renewal_idle_ms(live))
                self.statements += 1
                renewed = renewals.renew(conn, ids, attempts, seconds)
                missed = [lease.id for lease in live if (lease.id, lease.attempt) not in renewed]
                # Only a round that lost leases asks why.
                verdicts = renewals.renew_verdicts(conn, missed) if missed else {}
            return renewed, verdicts

        try:
            with self._expiring(live, result):
                # A deadlock or serialization failure rolled the round back:
                # it runs again at once, not a round later.
                renewed, verdicts = db.retrying(renew, self.dsn, what="lease renewal")
        except (psycopg.Error, OSError, Exception) as exc:  # noqa: BLE001 - any failure is a failed round
            result.error = db.first_line(exc)
            log.warning("lease renewal failed: %s", result.error)
            self._retry_at = sent_at + self.window(live)
            now = time.monotonic()
            for lease in live:
                lease.failing = True
                if lease.expired(now) and lease.mark_lost("renewal_failed"):
                    result.add_lost("renewal_failed")
            return result
        finally:
            metrics.HEARTBEAT_DURATION.observe(time.monotonic() - sent_at)
        for lease in live:
            if lease.lost_reason is not None:
                continue   # given up at its deadline while the answer was late
            if (lease.id, lease.attempt) in renewed:
                lease.renewed(sent_at)
                result.renewed += 1
                continue
            verdict = verdicts.get(lease.id)
            if verdict is not None and verdict.status == "done" and verdict.attempt == lease.attempt:
                # Completed by this very attempt after the round read the
                # leases: the lease ended as it should, nothing was lost.
                self.untrack(lease)
                continue
            reason = "cancelled" if verdict is not None and verdict.status == "cancelled" else "renewal_rejected"
            if lease.mark_lost(reason):
                result.add_lost(reason)
        return result

    def release(self, items: list[tuple[int, int, bool, str | None]]) -> int:
        """Release jobs of dead workers, fenced: ``(id, attempt, reclaim,
        error)`` each; with ``error`` the attempt is reported failed instead,
        retried after the same backoff as a failure the worker reports
        (``self.backoff``).  Returns how many were still owned."""
        done = 0
        with self._pool.connection() as conn:
            for job_id, attempt, reclaim, error in items:
                outcome: jobs.Reported | jobs.Released | None
                if error:
                    # The only error reported here: killed past its timeout.
                    outcome = jobs.fail_or_retry(conn, job_id, attempt, error=error, traceback=None, final=False,
                                                 backoff=self.backoff, outcome="timeout")
                else:
                    outcome = jobs.release(conn, job_id, attempt, reclaim=reclaim,
                                           reason="worker died" if reclaim else None,
                                           detail="worker died" if reclaim else "its worker stopped before it ended")
                done += outcome is not None
        return done

    def owned(self, owner: str) -> list[tuple[int, int]]:
        """(id, attempt) of the running jobs claimed under ``owner``."""
        with self._pool.connection() as conn:
            return [(job.id, job.attempt) for job in jobs.owned_running(conn, owner)]

    @contextlib.contextmanager
    def _expiring(self, leases: list[Lease], result: RenewResult) -> Iterator[None]:
        """While the block runs, mark each lease lost at its deadline.

        A round can block far longer than a lease: waiting for a connection
        the pool cannot make, or for the answer to a statement that a broken
        network never delivers.  The leases must still be given up on time.
        """
        stop = threading.Event()
        # A renewal is in flight for each of them from now until it is
        # accepted: a deadline that passes meanwhile passed because the
        # database did not answer in time (renewal_failed), whoever notices
        # it first, this watcher or the holder's own check().
        for lease in leases:
            lease.failing = True

        def watch() -> None:
            while True:
                now = time.monotonic()
                pending = []
                for lease in leases:
                    if lease.lost_reason is not None or not lease.enforce_deadline:
                        continue
                    if lease.expired(now):
                        if lease.mark_lost("renewal_failed"):
                            result.add_lost("renewal_failed")
                    else:
                        pending.append(lease.deadline)
                if not pending or stop.wait(min(pending) - now):
                    return

        watcher = threading.Thread(target=watch, name="pgfence-heartbeat-deadlines", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()

    # -- in-process thread ----------------------------------------------------

    def _open(self) -> None:
        self._pool.open()

    def start(self) -> None:
        """Run :meth:`run_once` every interval in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pgfence-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            # Cleared before the leases are read: a lease tracked from now on
            # sets it again and cuts the wait below short.
            self._wake.clear()
            now = time.monotonic()
            leases = self.tracked()
            try:
                self.run_once(leases, horizon=now + self.window(leases))
            except Exception:
                log.exception("heartbeat round crashed")
            now = time.monotonic()
            self._next_at = self.next_round(self.tracked(), now)
            self._wake.wait(max(0.0, self._next_at - now))

    def stop(self) -> None:
        """Stop the thread (if any) and close the pool; idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval * 2))
            self._thread = None
        self._pool.close(timeout=1.0)
