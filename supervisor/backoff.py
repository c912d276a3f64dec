"""The retry backoff: how long a failed attempt waits before the next one.

One policy for every failed attempt, whoever reports it: the worker that ran
the handler, or the heartbeat manager that reports the attempt of a worker
killed past its timeout.  :func:`pgfence.store.jobs.fail_or_retry` computes
the delay from it, so the two cannot drift apart.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple


class Backoff(NamedTuple):
    """Exponential backoff with jitter: attempt ``n`` waits half to all of
    ``base * 2**(n-1)`` seconds, the doubling capped at ``cap``."""

    base: float = 1.0
    cap: float = 300.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait after ``attempt`` (the jitter takes up to half off)."""
        # The exponent is bounded so that a job with thousands of attempts
        # gets the cap instead of a float overflow.
        return min(self.cap, self.base * 2.0 ** min(max(0, attempt - 1), 1000))

    def delay(self, attempt: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
        """Seconds before the attempt after ``attempt`` may run.  The jitter
        spreads the retries of jobs that failed together (a dependency that
        was down), so they do not all come back in the same instant."""
        ceiling = self.ceiling(attempt)
        return ceiling * uniform(0.5, 1.0)
