"""Measurements that need pgfence's own Python objects; run by bench/run.py
with the project's interpreter (.venv), prints one JSON object.

    python bench/pgfence_probe.py heartbeat DSN [LEASES] [ROUNDS]
    python bench/pgfence_probe.py renew LEASES ROUNDS DSN [DSN ...]

heartbeat: claims LEASES jobs (pgfence's claim, one statement), renews them
with HeartbeatManager.run_once ROUNDS times and reports each round's time;
then tracks them in a manager whose thread renews every 0.25 s for 2.5 s and
reports how many statements it sent (one per interval, whatever the count).

renew: claims LEASES of the jobs already queued in each database (nothing is
emptied: the soak section's databases hold a simulated history), then times
HeartbeatManager.run_once on each in turn, ROUNDS rounds, the order of the
databases alternating; each database's round times in milliseconds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

# The pgfence under test is the one installed in this interpreter
# (bench/run.py --project-python).
import psycopg
from psycopg.rows import dict_row

from pgfence.renewal.renewer import HeartbeatManager
from pgfence.worker.lease import Lease
from pgfence.store.queries import q

LEASE = 600.0   # long enough that nothing expires while we measure


def claim_leases(dsn: str, count: int, fresh: bool = True) -> list[Lease]:
    """Claim ``count`` jobs with pgfence's claim; ``fresh``: of a table
    emptied and filled with just those jobs first."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        if fresh:
            conn.execute("TRUNCATE pgfence.jobs, pgfence_examples.effects RESTART IDENTITY")
            conn.execute("INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, %s)", (count,))
            conn.execute("VACUUM ANALYZE pgfence.jobs")
        sent = time.monotonic()
        rows = conn.execute(q("claim"), {"queues": ["default"], "batch": count, "worker": "bench-heartbeat",
                                         "lease": LEASE, "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}).fetchall()
    if len(rows) != count:
        raise SystemExit(f"claimed {len(rows)} of {count} jobs")
    return [Lease(r["id"], r["attempt"], LEASE, r["queue"], r["kind"], deadline=sent + LEASE) for r in rows]


def heartbeat(dsn: str, count: int = 1000, rounds: int = 20) -> dict:
    leases = claim_leases(dsn, count)
    manager = HeartbeatManager(dsn, default_lease=LEASE, interval=60.0)
    try:
        manager.run_once(leases)            # opens the pool: not timed
        before = manager.statements
        times, renewed = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            result = manager.run_once(leases)
            times.append((time.perf_counter() - started) * 1000)
            renewed.append(result.renewed)
            if result.sent != count or result.error:
                raise SystemExit(f"round sent {result.sent} leases, error {result.error}")
        statements = manager.statements - before
    finally:
        manager.stop()

    # The thread: one statement per interval for all tracked leases.
    interval, span = 0.25, 2.5
    threaded = HeartbeatManager(dsn, default_lease=LEASE, interval=interval)
    for lease in leases:
        threaded.track(lease)
    threaded.start()
    time.sleep(span)
    threaded.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        still_owned = conn.execute("SELECT count(*) FROM pgfence.jobs WHERE status = 'running' "
                                   "AND lease_until > now() + interval '500 seconds'").fetchone()[0]
    return {
        "leases": count,
        "rounds": rounds,
        "round_ms": times,
        "median_ms": statistics.median(times),
        "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))],
        "renewed_per_round": sorted(set(renewed)),
        "statements_for_rounds": statements,
        "thread_interval_s": interval,
        "thread_span_s": span,
        "thread_statements": threaded.statements,
        "thread_expected_statements": int(span / interval) + 1,
        "leases_still_renewed": still_owned,
    }


def renew(count: int, rounds: int, dsns: list[str]) -> dict:
    managers = []
    try:
        for dsn in dsns:
            leases = claim_leases(dsn, count, fresh=False)
            manager = HeartbeatManager(dsn, default_lease=LEASE, interval=60.0)
            managers.append((manager, leases))
            manager.run_once(leases)        # opens the pool: not timed
        times: list[list[float]] = [[] for _ in dsns]
        for i in range(rounds):
            order = range(len(dsns)) if i % 2 == 0 else reversed(range(len(dsns)))
            for k in order:
                manager, leases = managers[k]
                started = time.perf_counter()
                result = manager.run_once(leases)
                times[k].append((time.perf_counter() - started) * 1000)
                if result.renewed != count or result.error:
                    raise SystemExit(f"a round renewed {result.renewed} of {count} leases, error {result.error}")
    finally:
        for manager, _ in managers:
            manager.stop()
    return {"leases": count, "rounds": rounds, "round_ms": times,
            "median_ms": [statistics.median(t) for t in times]}


def main(argv: list[str]) -> None:
    if len(argv) > 3 and argv[0] == "renew":
        print(json.dumps(renew(int(argv[1]), int(argv[2]), argv[3:])))
    elif argv and argv[0] == "heartbeat":
        count = int(argv[2]) if len(argv) > 2 else 1000
        rounds = int(argv[3]) if len(argv) > 3 else 20
        print(json.dumps(heartbeat(argv[1], count, rounds)))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
