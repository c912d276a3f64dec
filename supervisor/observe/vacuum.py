"""What the metrics server makes of pgfence.jobs' vacuum state: the
``pgfence_jobs_*`` and ``pgfence_xmin_horizon_age_seconds`` gauges, and a
WARNING in the log when vacuum falls behind or the xmin horizon is held.

Each warning is logged once when its condition starts, and an INFO line
when it ends, never once per refresh: the dead row versions must fall under
half of the bound (so a count that hovers at the bound does not fill the
log), the horizon's age under the bound.  The dead row versions must also
stay at or above the bound for :data:`DEAD_WARN_AFTER`: a busy queue whose
vacuum keeps up passes it for a while between two autovacuum rounds (one
per ``autovacuum_naptime``, 60 s by default), and that is not falling
behind.
"""

from __future__ import annotations

import logging

from pgfence.observe import metrics
from pgfence.store.vacuum import VacuumStats

log = logging.getLogger("pgfence.metrics")

#: Seconds the dead row versions must stay at or above the bound before the
#: warning: two autovacuum rounds at the default naptime.
DEAD_WARN_AFTER = 120.0


class UntimedAges:
    """Ages of the horizon's holders whose start PostgreSQL does not show
    this role (other roles' transactions, replication slots), counted from
    when this object first saw each: a lower bound of the true age."""

    def __init__(self) -> None:
        self._first_seen: dict[str, float] = {}

    def oldest(self, untimed: list[str], now: float) -> tuple[float, str | None]:
        """The age and description of the oldest of ``untimed`` (entries
        ``key description``); (0, None) if there are none."""
        described = {key: text or key for key, _, text in (entry.partition(" ") for entry in untimed)}
        self._first_seen = {key: self._first_seen.get(key, now) for key in described}
        if not described:
            return 0.0, None
        key = min(self._first_seen, key=lambda k: self._first_seen[k])
        return now - self._first_seen[key], described[key]


def horizon(stats: VacuumStats, untimed: UntimedAges, now: float) -> tuple[float, str | None]:
    """The age in seconds of the oldest holder of the xmin horizon and who
    it is, timed or not; (0, None) if nothing holds it."""
    age, holder = untimed.oldest(stats.untimed, now)
    if stats.horizon_holder is not None and stats.horizon_age >= age:
        return stats.horizon_age, stats.horizon_holder
    return age, holder


class VacuumWatch:
    """Sets the vacuum gauges from each :class:`VacuumStats` and logs the
    warnings.  ``warn_dead_tuples`` and ``warn_horizon`` (seconds) are the
    bounds; None turns a warning off."""

    def __init__(self, warn_dead_tuples: int | None, warn_horizon: float | None,
                 dead_warn_after: float = DEAD_WARN_AFTER) -> None:
        self.warn_dead_tuples = warn_dead_tuples
        self.warn_horizon = warn_horizon
        self.dead_warn_after = dead_warn_after
        #: When the dead row versions reached the bound (None: under it).
        self.dead_above_since: float | None = None
        self.untimed = UntimedAges()
        self.dead_warned = False
        self.horizon_warned = False

    def observe(self, stats: VacuumStats, now: float) -> list[str]:
        """Set the gauges; log and return the warnings that start now."""
        age, holder = horizon(stats, self.untimed, now)
        metrics.JOBS_DEAD_TUPLES.set(stats.dead_tuples)
        metrics.JOBS_LIVE_TUPLES.set(stats.live_tuples)
        metrics.JOBS_SINCE_VACUUM.set(stats.since_vacuum)
        metrics.JOBS_AUTOVACUUM.labels("server").set(int(stats.autovacuum_server))
        metrics.JOBS_AUTOVACUUM.labels("table").set(int(stats.autovacuum_table))
        metrics.XMIN_HORIZON_AGE.set(age)
        warnings = []
        bound = self.warn_dead_tuples
        above = bound is not None and stats.dead_tuples >= bound
        if not above:
            self.dead_above_since = None
        elif self.dead_above_since is None:
            self.dead_above_since = now
        if above and not self.dead_warned and now - (self.dead_above_since or now) >= self.dead_warn_after:
            self.dead_warned = True
            warnings.append(
                f"vacuum falls behind: pgfence.jobs holds {stats.dead_tuples} dead row versions "
                f"({stats.live_tuples} live), at least vacuum_warn_dead_tuples ({bound}) for "
                f"{now - (self.dead_above_since or now):.0f}s; autovacuum "
                f"{'on' if stats.autovacuum else 'OFF'} for it, last vacuum {stats.since_vacuum:.0f}s ago")
        elif self.dead_warned and (bound is None or stats.dead_tuples < bound / 2):
            self.dead_warned = False
            log.info("pgfence.jobs is back to %d dead row versions", stats.dead_tuples)
        limit = self.warn_horizon
        if limit is not None and not self.horizon_warned and age >= limit:
            self.horizon_warned = True
            warnings.append(
                f"the xmin horizon has been held for {age:.0f}s by {holder}, vacuum_warn_horizon is {limit:g}s: "
                f"VACUUM cannot remove the dead row versions made since; end that transaction")
        elif self.horizon_warned and (limit is None or age < limit):
            self.horizon_warned = False
            log.info("the xmin horizon is held no longer (oldest holder now %.0fs)", age)
        for line in warnings:
            log.warning("%s", line)
        return warnings
