"""What the metrics server makes of the concurrency and rate limits: the
``pgfence_limit_*`` gauges and ``pgfence_jobs_held_back``, one series per
kind with limits (never one per concurrency key), set from the rows of
:func:`pgfence.store.limits.list_limits`.

A kind whose limits row went since the last refresh reads 0, as a queue
status that emptied does: a gauge of the multiprocess collector cannot be
removed, and its last value must not stay.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgfence.observe import metrics
from pgfence.store.limits import LimitRow


def rate_per_second(row: LimitRow) -> float:
    """The kind's rate in force in starts a second (its count over its
    period); 0 when it has none."""
    if row.rate_count is None or not row.rate_period:
        return 0.0
    return row.rate_count / row.rate_period


class LimitGauges:
    """Sets the limits' gauges from each refresh's rows."""

    def __init__(self) -> None:
        #: Every kind a refresh has shown.
        self.kinds: set[str] = set()

    def observe(self, rows: Iterable[LimitRow]) -> int:
        """Set the gauges from ``rows``; return how many kinds they hold."""
        seen = set()
        for row in rows:
            seen.add(row.kind)
            self._set(row.kind, row.running + row.admitted, row.concurrency or 0, row.per_key_concurrency or 0,
                      rate_per_second(row), row.waiting, row.scheduled)
        for kind in self.kinds - seen:
            self._set(kind, 0, 0, 0, 0.0, 0, 0)
        self.kinds |= seen
        return len(seen)

    @staticmethod
    def _set(kind: str, in_use: int, concurrency: int, per_key: int, rate: float, waiting: int,
             scheduled: int) -> None:
        metrics.LIMIT_SLOTS_IN_USE.labels(kind).set(in_use)
        metrics.LIMIT_CONCURRENCY.labels(kind).set(concurrency)
        metrics.LIMIT_PER_KEY_CONCURRENCY.labels(kind).set(per_key)
        metrics.LIMIT_RATE.labels(kind).set(rate)
        held = dict(zip(metrics.HELD_BACK_REASONS, (waiting, scheduled), strict=True))
        for reason, count in held.items():
            metrics.JOBS_HELD_BACK.labels(kind, reason).set(count)
