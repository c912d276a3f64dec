"""What a worker's jobs came to: the outcome of each run, as the engine and
the tests name them, and the counts of a worker's claims and outcomes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: Outcomes of a job's run, also what the tests assert.
DONE, RETRIED, FAILED, LOST, RELEASED = "done", "retried", "failed", "lost", "released"
#: A job of a kind this worker does not know, handed back for another worker.
PUT_BACK = "put_back"
#: A job whose handler raised RateLimited, handed back until its retry_after.
RATE_LIMITED = "rate_limited"
#: A job run but not yet completed: its completion is batched with others.
DEFERRED = "deferred"


@dataclass
class Stats:
    claimed: int = 0
    reclaimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, outcome: str) -> None:
        # Jobs end on many threads at once in a worker that runs many.
        with self._lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def ran(self) -> int:
        """Jobs that ran (put-backs ran nothing)."""
        with self._lock:
            return sum(n for outcome, n in self.outcomes.items() if outcome not in (PUT_BACK, RATE_LIMITED))
