"""pgfence's own VACUUM of pgfence.jobs, for when autovacuum is off or
falls behind.

Dead row versions of the jobs table sit in the claim's and the reclaim
scan's index paths until a VACUUM removes them, and throughput follows:
measured with autovacuum off, a steady drain fell from 5,940 to 910 jobs/s
in 4 minutes.  Autovacuum is the right tool, and migration 0010 tunes it for
this table; but a server may run with it off, and even on, it visits a
database at most once per ``autovacuum_naptime``.  So when the table holds
``self_vacuum_dead_tuples`` dead versions, the heartbeat manager's process
runs a plain ``VACUUM (SKIP_LOCKED)`` of it (never FULL, which would lock
out every claim), on an autocommit connection of its own, from a thread
of its own so that no renewal waits for it.

At most one VACUUM every :data:`INTERVAL` seconds.  A VACUUM that leaves
the dead versions above the bound met a held xmin horizon (a long
transaction, a forgotten session): the next ones wait twice as long each
time, up to :data:`MAX_INTERVAL`, since they could remove nothing more until
the horizon moves.  A role that may not VACUUM the table (PostgreSQL would
skip it with a WARNING, not an error) is never sent one: it gets one
WARNING in the log, and autovacuum is left to keep up alone.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from pgfence.backoff import Backoff
from pgfence.background import Service
from pgfence.observe import metrics
from pgfence.store import db
from pgfence.store.vacuum import VacuumStats, vacuum_jobs, vacuum_stats

log = logging.getLogger("pgfence.vacuum")

#: Seconds between two looks at the table (and at most one VACUUM in each).
INTERVAL = 15.0
#: The longest wait after VACUUMs that a held horizon made useless.
MAX_INTERVAL = 240.0


class VacuumRound(NamedTuple):
    """What one :meth:`SelfVacuum.run_once` did."""

    #: ``below`` (under the bound), ``not_permitted``, or the result of the
    #: VACUUM run: ``done``, ``held`` (the dead versions stayed above the
    #: bound), ``skipped`` (someone else was vacuuming the table).
    result: str
    dead_before: int
    dead_after: int
    seconds: float = 0.0


class SelfVacuum(Service[VacuumRound]):
    """Runs a VACUUM of pgfence.jobs when it holds ``dead_tuples`` dead row
    versions; :meth:`run_once` looks once, :meth:`start` looks every
    ``interval`` from a thread until :meth:`stop`."""

    thread_name = "pgfence-self-vacuum"
    application_name = "pgfence vacuum"
    failure = "self-vacuum of pgfence.jobs failed"

    def __init__(self, dsn: str, dead_tuples: int, *, interval: float = INTERVAL,
                 max_interval: float = MAX_INTERVAL) -> None:
        if dead_tuples < 1 or interval <= 0 or max_interval < interval:
            raise ValueError("SelfVacuum needs dead_tuples >= 1 and 0 < interval <= max_interval")
        super().__init__(dsn, interval=interval, log=log)
        self.dead_tuples = dead_tuples
        self.backoff = Backoff(interval, max_interval)
        #: VACUUMs in a row that a held horizon made useless.
        self.held = 0
        self.refused = False

    def run_once(self) -> VacuumRound:
        """Look at the table and VACUUM it if due; what was done."""
        conn = self.connection()
        with db.translated(self.dsn):
            before = vacuum_stats(conn)
        if before.dead_tuples < self.dead_tuples:
            self.held = 0
            return VacuumRound("below", before.dead_tuples, before.dead_tuples)
        if not before.may_vacuum:
            if not self.refused:
                self.refused = True
                log.warning("pgfence.jobs holds %d dead row versions and this role may not VACUUM it (it needs to "
                            "own the table or the database, or on PostgreSQL 17 the MAINTAIN privilege): autovacuum "
                            "must keep up alone; self_vacuum_dead_tuples none stops this check", before.dead_tuples)
            return VacuumRound("not_permitted", before.dead_tuples, before.dead_tuples)
        started = time.monotonic()
        with db.translated(self.dsn):
            vacuum_jobs(conn)
            after = vacuum_stats(conn)
        seconds = time.monotonic() - started
        result = self._verdict(before, after)
        metrics.SELF_VACUUMS.labels(result).inc()
        log.log(logging.DEBUG if result == "done" else logging.INFO,
                "VACUUM pgfence.jobs (%s): %d dead row versions before, %d after, %.2fs; autovacuum %s", result,
                before.dead_tuples, after.dead_tuples, seconds, "on" if before.autovacuum else "off")
        return VacuumRound(result, before.dead_tuples, after.dead_tuples, seconds)

    def _verdict(self, before: VacuumStats, after: VacuumStats) -> str:
        if after.vacuum_count == before.vacuum_count:
            return "skipped"
        if after.dead_tuples >= self.dead_tuples:
            self.held += 1
            return "held"
        self.held = 0
        return "done"

    def wait(self) -> float:
        """Seconds until the next look: the interval, doubled for each
        VACUUM in a row that a held horizon made useless."""
        return self.backoff.ceiling(self.held + 1)

    def wait_after(self, result: VacuumRound) -> float:
        return self.wait()

    def retry_wait(self, failures: int) -> float:
        return self.wait()
