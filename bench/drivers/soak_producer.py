"""The soak section's producer: enqueues no-op jobs at a steady offered rate,
paced by the clock and never by the workers, in small batches.

    python -m drivers.soak_producer {pgfence|pgqueuer} DSN RATE SECONDS [TICK_MS]

Every TICK_MS (default 20) it enqueues, in one transaction, the jobs the
clock says are due: RATE x the time since the start, less those already
sent.  A tick that ran late is caught up by the next one (a larger batch),
so the rate offered over the run is RATE as long as the producer keeps up;
what it managed is printed at the end as one JSON object (jobs sent, the
seconds taken, the largest batch and how far behind the clock it fell), and
the harness treats a run where it fell short as not offered.

Each system's batch goes in as one statement: pgfence's as a plain
``INSERT INTO pgfence.jobs (kind)`` (a producer's documented bulk path; the
kinds trigger fills in the options) and the notification that
``pgfence.enqueue()`` would send, in one transaction; pgqueuer's through its
own ``Queries.enqueue`` of a list, on asyncpg.  ``pgfence.enqueue()`` row by
row costs the server about 60-75 us a job (bench/README.md, enqueue cost),
which on 2 cores would take the producer a core at 12,000 jobs/s and so
measure the producer, not the workers.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

INSERT_PGFENCE = "INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, %s)"
NOTIFY_PGFENCE = "SELECT pg_notify('pgfence_jobs', 'default')"


class Pace:
    """How many jobs are due at each tick, and what the run achieved."""

    def __init__(self, rate: float, seconds: float, tick: float):
        self.rate, self.seconds, self.tick = rate, seconds, tick
        self.start = time.monotonic()
        self.sent = 0
        self.largest = 0
        self.behind_s = 0.0
        self.stopped = False

    def due(self) -> int:
        """Jobs due now; 0 once the run's time is up."""
        elapsed = time.monotonic() - self.start
        if elapsed >= self.seconds or self.stopped:
            return 0
        n = int(self.rate * elapsed) - self.sent
        return max(0, n)

    def sent_batch(self, n: int) -> float:
        """Count a batch; the seconds to sleep until the next tick."""
        self.sent += n
        self.largest = max(self.largest, n)
        elapsed = time.monotonic() - self.start
        self.behind_s = max(self.behind_s, elapsed - self.sent / self.rate) if self.rate else 0.0
        return self.tick - (elapsed % self.tick)

    def done(self) -> bool:
        return self.stopped or time.monotonic() - self.start >= self.seconds

    def summary(self) -> dict:
        elapsed = min(time.monotonic() - self.start, self.seconds)
        return {"rate": self.rate, "sent": self.sent, "seconds": round(elapsed, 3),
                "offered_per_s": round(self.sent / elapsed, 1) if elapsed else 0.0,
                "largest_batch": self.largest, "max_behind_s": round(self.behind_s, 3)}


def produce_pgfence(dsn: str, pace: Pace) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name="pgfence-bench producer") as conn:
        while not pace.done():
            n = pace.due()
            if n:
                with conn.transaction():
                    conn.execute(INSERT_PGFENCE, (n,), prepare=True)
                    conn.execute(NOTIFY_PGFENCE, prepare=True)
            time.sleep(max(0.0, pace.sent_batch(n)))


async def produce_pgqueuer(dsn: str, pace: Pace) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))
    while not pace.done():
        n = pace.due()
        if n:
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        await asyncio.sleep(max(0.0, pace.sent_batch(n)))


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] not in ("pgfence", "pgqueuer"):
        raise SystemExit(__doc__)
    pace = Pace(float(argv[2]), float(argv[3]), (float(argv[4]) if len(argv) > 4 else 20.0) / 1000)

    def stop(_signum: int, _frame: object) -> None:
        pace.stopped = True

    signal.signal(signal.SIGTERM, stop)
    if argv[0] == "pgfence":
        produce_pgfence(argv[1], pace)
    else:
        asyncio.run(produce_pgqueuer(argv[1], pace))
    print(json.dumps(pace.summary()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
