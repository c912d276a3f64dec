"""What the metrics server makes of the concurrency limits: the
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
                      row.waiting, row.scheduled)
        for kind in self.kinds - seen:
            self._set(kind, 0, 0, 0, 0, 0)
        self.kinds |= seen
        return len(seen)

    @staticmethod
    def _set(kind: str, in_use: int, concurrency: int, per_key: int, waiting: int, scheduled: int) -> None:
        metrics.LIMIT_SLOTS_IN_USE.labels(kind).set(in_use)
        metrics.LIMIT_CONCURRENCY.labels(kind).set(concurrency)
        metrics.LIMIT_PER_KEY_CONCURRENCY.labels(kind).set(per_key)
        held = dict(zip(metrics.HELD_BACK_REASONS, (waiting, scheduled), strict=True))
        for reason, count in held.items():
            metrics.JOBS_HELD_BACK.labels(kind, reason).set(count)
