"""The scheduler: enqueues each tick of the schedules this supervisor
declares, exactly once across every supervisor, on the database's clock.

It is a thread of the heartbeat manager's process (which already holds
connections; the arbiter keeps none) with one connection of its own.  There
is no leader: every supervisor runs one for the schedules it declares, and
they agree through the database.  A round is one transaction:

1. lock the rows of its schedules in ``pgfence.schedules``, skipping rows
   another supervisor's scheduler holds at that moment (it is deciding the
   same ticks), and read the database's clock;
2. for each, the ticks since ``checked_until`` up to that clock
   (:func:`pgfence.scheduling.plan.due`: catch-up after downtime) and what to
   do with each (:func:`pgfence.scheduling.plan.decide`: overlap);
3. a row of ``pgfence.schedule_ticks`` per tick, whose primary key
   (schedule, tick) the database enforces, with its job enqueued in the same
   statement; then ``checked_until`` moves to the clock read in 1.

The host's clock decides nothing: a tick is due when the database's clock
says so, and the wait for the next tick is measured on the monotonic clock
from the database's reading.  (``PGFENCE_TEST_HOST_CLOCK_OFFSET`` shifts the
host clock this module reads, for the tests that prove it; the
``pgfence_periodic_host_clock_skew_seconds`` gauge shows the difference.)
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgfence.background import Service
from pgfence.observe import metrics
from pgfence.scheduling import plan
from pgfence.scheduling.schedule import Schedule
from pgfence.store import db
from pgfence.store import periodic as ticks

log = logging.getLogger("pgfence.periodic")

#: The longest wait between two rounds (a schedule whose next tick is hours
#: away is still looked at, and its last run's status refreshed).
MAX_WAIT = 5.0
#: The longest wait while ticks are queued behind a running job: the next
#: one is enqueued within this of the running one's end.
QUEUED_WAIT = 1.0
#: How often the status of each schedule's last run is read for the gauge.
LAST_RUN_INTERVAL = 5.0
#: Wake this long after a tick's time, so the database's clock has passed it.
LATE = 0.002


def host_clock_offset() -> float:
    """The test hook's shift of the host clock, in seconds (0 without it)."""
    text = os.environ.get("PGFENCE_TEST_HOST_CLOCK_OFFSET", "").strip()
    try:
        return float(text) if text else 0.0
    except ValueError:
        log.warning("PGFENCE_TEST_HOST_CLOCK_OFFSET=%r is not a number of seconds: ignored", text)
        return 0.0


@dataclass
class Round:
    """What one round decided (committed)."""

    #: Schedules decided in this round (others were locked elsewhere).
    decided: list[str] = field(default_factory=list)
    enqueued: dict[str, list[dt.datetime]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)
    lags: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds until the next round is due.
    wait: float = MAX_WAIT


class Scheduler(Service[Round]):
    """Decides the ticks of ``schedules``: :meth:`run_once` one round,
    :meth:`start` rounds from a thread until :meth:`stop`."""

    thread_name = "pgfence-scheduler"
    application_name = "pgfence scheduler"
    failure = "scheduler round failed (nothing enqueued by it; trying again)"
    join_timeout = 10.0

    def __init__(self, dsn: str, schedules: list[Schedule], *, grace: float) -> None:
        super().__init__(dsn, interval=MAX_WAIT, log=log)
        self.schedules = {s.name: s for s in schedules}
        self.names = sorted(self.schedules)
        self.grace = grace
        self.offset = host_clock_offset()
        self._declared = False
        self._last_runs_at = 0.0
        self.rounds = 0
        metrics.initialise_schedules(self.names)

    def host_now(self) -> float:
        """The host's clock (seconds since the epoch), as this module reads it."""
        return time.time() + self.offset

    def connected(self, conn: psycopg.Connection[Any]) -> None:
        self._declared = False   # a new session declares the schedules again

    def declare(self) -> None:
        """Write this supervisor's schedules (a new one owes no tick before now)."""
        conn = self.connection()
        with db.translated(self.dsn), conn.transaction():
            for name in self.names:
                ticks.declare(conn, self.schedules[name])
        self._declared = True

    def run_once(self) -> Round:
        """One round: decide every due tick of the schedules not locked
        elsewhere, in one transaction; return what was committed."""
        conn = self.connection()
        if not self._declared:
            self.declare()
        # The last runs' statuses are read before this round enqueues: read
        # after it, the job of a tick just enqueued is always still queued,
        # and a schedule ticking every few seconds never showed a failure.
        if time.monotonic() - self._last_runs_at >= LAST_RUN_INTERVAL:
            self._refresh_last_runs(conn)
        result = Round()
        queued_waiting = False
        with db.translated(self.dsn):
            with conn.transaction():
                locked = ticks.lock(conn, self.names)
                read_at = time.monotonic()
                host = self.host_now()
                for row in locked:
                    schedule = self.schedules[row.name]
                    queued_waiting |= self._decide(conn, schedule, row, result)
            now = locked[0].now if locked else ticks.clock(conn)
            if not locked:
                read_at, host = time.monotonic(), self.host_now()
        metrics.PERIODIC_CLOCK_SKEW.set(host - now.timestamp())
        self._count(result)
        self.rounds += 1
        # The next round: the earliest next tick on the database's clock,
        # waited for on the monotonic one.
        wait = min(MAX_WAIT, QUEUED_WAIT if queued_waiting else MAX_WAIT)
        for schedule in self.schedules.values():
            wait = min(wait, (schedule.next_tick(now) - now).total_seconds() + LATE)
        result.wait = max(0.0, wait - (time.monotonic() - read_at))
        return result

    def _decide(self, conn: psycopg.Connection[Any], schedule: Schedule, row: ticks.Locked, result: Round) -> bool:
        """Decide one schedule's due ticks; whether ticks still wait in line."""
        due = plan.due(schedule, row.checked_until, row.now, self.grace)
        actions = plan.decide(schedule.overlap, due.ticks, row.busy, list(row.queued))
        last_tick, last_job = None, None
        name = schedule.name
        waiting = len(row.queued)
        for action in actions:
            if action.verb == "enqueue":
                last_job, lag = ticks.enqueue(conn, schedule, action.tick)
            elif action.verb == "dequeue":
                done = ticks.dequeue(conn, schedule, action.tick)
                if done is None:
                    continue
                last_job, lag = done
                waiting -= 1
            else:
                ticks.record(conn, name, action.tick, "skipped" if action.verb == "skip" else "queued")
                if action.verb == "skip":
                    result.skipped[name] = result.skipped.get(name, 0) + 1
                else:
                    result.queued[name] = result.queued.get(name, 0) + 1
                    waiting += 1
                continue
            last_tick = action.tick
            result.enqueued.setdefault(name, []).append(action.tick)
            result.lags.setdefault(name, []).append(lag)
        if due.missed:
            result.missed[name] = due.missed
            log.warning("schedule %r: %d ticks missed while no scheduler ran (catch_up %s)", name, due.missed,
                        schedule.catch_up)
        ticks.advance(conn, name, row.now, last_tick, last_job, due.missed)
        result.decided.append(name)
        return waiting > 0

    def _count(self, result: Round) -> None:
        """Count what the committed round decided."""
        for name, enqueued in result.enqueued.items():
            metrics.PERIODIC_TICKS.labels(name, "enqueued").inc(len(enqueued))
            metrics.observe_many(metrics.PERIODIC_LAG.labels(name), result.lags.get(name, []))
            log.debug("schedule %r: enqueued %s", name, ", ".join(t.isoformat() for t in enqueued))
        for outcome, counts in (("skipped", result.skipped), ("queued", result.queued), ("missed", result.missed)):
            for name, count in counts.items():
                metrics.PERIODIC_TICKS.labels(name, outcome).inc(count)

    def _refresh_last_runs(self, conn: psycopg.Connection[Any]) -> None:
        with db.translated(self.dsn):
            statuses = ticks.last_runs(conn, self.names)
        for name in self.names:
            status = statuses.get(name)
            # The last run that ENDED decides: while the newest tick's job
            # is queued or running (a retry waiting included), the gauge
            # keeps what the run before it said, so that a schedule whose
            # every run fails shows 1 for as long as that lasts.
            if status not in ("queued", "running"):
                metrics.PERIODIC_LAST_RUN_FAILED.labels(name).set(1 if status == "failed" else 0)
        self._last_runs_at = time.monotonic()

    # -- the thread's waits -----------------------------------------------------

    def wait_after(self, result: Round) -> float:
        return result.wait

    def retry_wait(self, failures: int) -> float:
        """Nothing was committed: half a second more per failure in a row."""
        return min(MAX_WAIT, 0.5 * failures)
