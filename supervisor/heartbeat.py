"""The heartbeat manager: renews the leases of many running jobs in ONE
statement per interval.

It learns per job which renewals were rejected (the attempt no longer owns
the job, or the job was cancelled) and marks those leases lost; when the
database cannot be reached it marks a lease lost once its local deadline
passes (see :mod:`supervisor.lease`).  A job that has run longer than its
kind's timeout is no longer renewed.

The manager is a plain object with :meth:`run_once`, which returns what it
did; :meth:`start` runs it in a thread for an in-process worker, and the
supervisor runs it in a process of its own for all children.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg_pool import ConnectionPool

from . import db, metrics
from .lease import Lease
from .queries import q

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


class HeartbeatManager:
    """Renews every tracked lease in one batched statement per ``interval``.

    ``interval`` defaults to a third of the shortest lease it tracks, or of
    ``default_lease``.  ``statements`` counts the renewal statements sent.
    """

    def __init__(self, dsn: str, *, default_lease: float = 30.0, interval: float | None = None,
                 application_name: str = "pgfence heartbeat", prepare: bool = False):
        if default_lease <= 0:
            raise ValueError("default_lease must be positive")
        if interval is not None and interval <= 0:
            raise ValueError("interval must be positive")
        self.dsn = dsn
        self.default_lease = default_lease
        self.interval = interval if interval is not None else default_lease / 3
        self.statements = 0
        self._leases: dict[tuple[int, int], Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The statement may not outlive the interval: a renewal that is late
        # is worth nothing, and the next round tries again.
        self._timeout_ms = str(max(100, int(self.interval * 1000)))
        self._pool = ConnectionPool(
            db.conninfo(dsn, application_name=application_name),
            min_size=1, max_size=1, open=False, timeout=max(1.0, self.interval),
            kwargs={"autocommit": True, "prepare_threshold": db.prepare_threshold(prepare)},
            reconnect_timeout=3600 * 24 * 365,
            name="pgfence-heartbeat",
        )
        self._opened = False

    # -- tracking ---------------------------------------------------------

    def track(self, lease: Lease) -> None:
        with self._lock:
            self._leases[(lease.id, lease.attempt)] = lease

    def untrack(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop((lease.id, lease.attempt), None)

    def tracked(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    # -- one round --------------------------------------------------------

    def run_once(self, leases: list[Lease] | None = None) -> RenewResult:
        """Renew all held leases (or ``leases``) in one statement; return what
        happened."""
        result = RenewResult()
        now = time.monotonic()
        live: list[Lease] = []
        for lease in (self.tracked() if leases is None else leases):
            if lease.lost_reason is not None:
                continue
            if lease.timed_out(now):
                if lease.mark_lost("timeout"):
                    result.add_lost("timeout")
                continue
            if lease.expired(now):
                if lease.mark_lost("renewal_failed"):
                    result.add_lost("renewal_failed")
                continue
            live.append(lease)
        if not live:
            return result
        result.sent = len(live)
        params = {
            "ids": db.array_literal(lease.id for lease in live),
            "attempts": db.array_literal(lease.attempt for lease in live),
            "leases": db.array_literal(float(lease.seconds) for lease in live),
        }
        sent_at = time.monotonic()
        try:
            with self._expiring(live, result):
                self._open()
                with self._pool.connection() as conn, conn.transaction():
                    # Settings for this transaction only: a startup option or
                    # a session SET would not survive (or would leak through)
                    # a transaction-pooling PgBouncer.
                    conn.execute(q("renewal_settings"), {"ms": self._timeout_ms})
                    self.statements += 1
                    renewed = set(conn.execute(q("renew"), params).fetchall())
                    missed = [lease.id for lease in live if (lease.id, lease.attempt) not in renewed]
                    # Only a round that lost leases asks why.
                    statuses = dict(
                        (job_id, status) for job_id, status, _attempt in
                        conn.execute(q("renew_verdicts"), {"ids": missed}).fetchall()) if missed else {}
        except (psycopg.Error, OSError, Exception) as exc:  # noqa: BLE001 - any failure is a failed round
            result.error = db.first_line(exc)
            log.warning("lease renewal failed: %s", result.error)
            now = time.monotonic()
            for lease in live:
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
            else:
                reason = "cancelled" if statuses.get(lease.id) == "cancelled" else "renewal_rejected"
                if lease.mark_lost(reason):
                    result.add_lost(reason)
        return result

    def release(self, items: list[tuple[int, int, bool, str | None]]) -> int:
        """Release jobs of dead workers, fenced: ``(id, attempt, reclaim,
        error)`` each; with ``error`` the attempt is reported failed (retried
        with backoff) instead.  Returns how many were still owned."""
        done = 0
        self._open()
        with self._pool.connection() as conn:
            for job_id, attempt, reclaim, error in items:
                if error:
                    row = conn.execute(q("fail_or_retry"), {"id": job_id, "attempt": attempt, "error": error,
                                                            "traceback": None, "final": False,
                                                            "backoff": 1.0}).fetchone()
                    if row is not None:
                        counter = metrics.JOBS_FAILED if row[0] == "failed" else metrics.JOBS_RETRIED
                        counter.labels(row[1], row[2]).inc()
                else:
                    row = conn.execute(q("release"), {"id": job_id, "attempt": attempt, "reclaim": reclaim,
                                                      "reason": "worker died" if reclaim else None}).fetchone()
                    if row is not None:
                        metrics.JOBS_RELEASED.labels(row[1], row[2]).inc()
                done += row is not None
        return done

    def owned(self, owner: str) -> list[tuple[int, int]]:
        """(id, attempt) of the running jobs claimed under ``owner``."""
        self._open()
        with self._pool.connection() as conn:
            return [tuple(r) for r in conn.execute(q("owned_running"), {"owner": owner})]

    @contextlib.contextmanager
    def _expiring(self, leases: list[Lease], result: RenewResult) -> Iterator[None]:
        """While the block runs, mark each lease lost at its deadline.

        A round can block far longer than a lease: waiting for a connection
        the pool cannot make, or for the answer to a statement that a broken
        network never delivers.  The leases must still be given up on time.
        """
        stop = threading.Event()

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
        if not self._opened:
            self._pool.open(wait=False)
            self._opened = True

    def start(self) -> None:
        """Run :meth:`run_once` every interval in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pgfence-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            # Reschedule before the work, so one slow or failed round does not
            # shift or stop the rounds after it.
            next_at += self.interval
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("heartbeat round crashed")
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        """Stop the thread (if any) and close the pool; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval * 2))
            self._thread = None
        if self._opened:
            self._pool.close(timeout=1.0)
            self._opened = False
