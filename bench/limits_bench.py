"""Concurrency and rate limits: what they cost the drain, and what a blocked
backlog costs the claim of other jobs.

    .venv/bin/python bench/limits_bench.py [--dsn ADMIN_DSN] [--n 20000] [--rounds 2] [--backlog 1000000] [--json]

1. Drain: ``--n`` no-op jobs enqueued with ``enqueue_many``, then a real
   ``pgfence run`` (default settings: 2 workers) until every job is done;
   jobs/s from its start to the last completion, and the machine's CPU
   (worker and PostgreSQL alike: both run here) per job.  Four ways, taken
   in turn for ``--rounds`` rounds (ABCD ABCD), each on a fresh database:
   no limit; a kind concurrency of 1,000 (above what the workers run at
   once, so the limit's own cost is what is measured); a per-key limit of 1
   over 10,000 keys; a rate of 1,000,000/s (above the drain rate).  The
   median of the rounds.
2. Blocked backlog: ``--backlog`` jobs of a kind with a concurrency of 1,
   its one slot held by a running job, so that all the others wait; then
   2,000 claims (and completions) of one ungated no-op job each, timed
   statement by statement; the same on a database without the backlog.
   p50 and p95 of the claim statement, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from harness import machine_busy

ROOT = Path(__file__).resolve().parent.parent
PGFENCE = [sys.executable, "-m", "pgfence"]
WAYS = ("none", "kind", "key", "rate")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--claims", type=int, default=2_000)
    p.add_argument("--json", action="store_true")
    return p.parse_args()


class Scratch:
    """A migrated scratch database on the admin DSN's server."""

    def __init__(self, admin: str):
        self.admin = admin
        self.name = f"pgfence_bench_limits_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.dsn = make_conninfo(**{**conninfo_to_dict(admin), "dbname": self.name})
        subprocess.run([*PGFENCE, "migrate", "--dsn", self.dsn], check=True, capture_output=True, cwd=ROOT)

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def drain(admin: str, way: str, n: int) -> dict:
    import pgfence
    from pgfence.admin import limits

    db = Scratch(admin)
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            if way == "kind":
                limits.set_limits(conn, "noop", concurrency=1000, by="bench")
            elif way == "key":
                limits.set_limits(conn, "noop", per_key_concurrency=1, by="bench")
            elif way == "rate":
                limits.set_limits(conn, "noop", rate="1000000/s", by="bench")
            jobs = [{"kind": "noop", "concurrency_key": f"customer:{i % 10_000}"} if way == "key"
                    else {"kind": "noop"} for i in range(n)]
            started = time.perf_counter()
            pgfence.enqueue_many(conn, jobs)
            enqueue_s = time.perf_counter() - started
            conn.execute("VACUUM ANALYZE pgfence.jobs")
            busy0 = machine_busy()[0]
            proc = subprocess.Popen([*PGFENCE, "run", "--dsn", db.dsn, "--handlers", "pgfence.handlers.builtin",
                                     "--metrics-port", "0"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                t0 = time.perf_counter()
                while conn.execute("SELECT count(*) FROM pgfence.jobs").fetchone()[0]:
                    time.sleep(0.02)
                    if time.perf_counter() - t0 > 600:
                        raise RuntimeError(f"{way}: not drained in 600s")
                first, last = conn.execute("SELECT min(started_at), max(finished_at) FROM pgfence.job_history"
                                           ).fetchone()
                busy = machine_busy()[0] - busy0
            finally:
                proc.terminate()
                proc.wait(30)
        seconds = (last - first).total_seconds()
        return {"jobs_per_s": n / seconds, "cpu_us_per_job": busy * 1e6 / n, "enqueue_per_s": n / enqueue_s}
    finally:
        db.drop()


def claim_latency(admin: str, backlog: int, claims: int) -> dict:
    import pgfence
    from pgfence.admin import limits
    from pgfence.store import jobs as store

    db = Scratch(admin)
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            if backlog:
                limits.set_limits(conn, "export", concurrency=1, by="bench")
                for start in range(0, backlog, 100_000):
                    with conn.transaction():
                        pgfence.enqueue_many(conn, [{"kind": "export"}] * min(100_000, backlog - start))
                # The one admitted job runs (and holds the slot) for the whole measure.
                store.claim(conn, queues=["default"], batch=1, worker="holder", lease=3600.0, lease_kinds=[],
                            lease_secs=[], reclaim=False)
                assert conn.execute("SELECT count(*) FROM pgfence.jobs WHERE held_back IS NOT NULL").fetchone()[0] \
                    == backlog - 1
            pgfence.enqueue_many(conn, [{"kind": "noop"}] * claims)
            conn.execute("VACUUM ANALYZE pgfence.jobs")
            times = []
            for _ in range(claims):
                t0 = time.perf_counter()
                rows = store.claim(conn, queues=["default"], batch=1, worker="bench", lease=30.0, lease_kinds=[],
                                   lease_secs=[], reclaim=False)
                times.append((time.perf_counter() - t0) * 1000)
                assert len(rows) == 1 and rows[0].kind == "noop", rows
                with conn.transaction():
                    store.complete(conn, rows[0].id, rows[0].attempt)
        times.sort()
        return {"p50_ms": round(times[len(times) // 2], 3), "p95_ms": round(times[int(len(times) * 0.95)], 3)}
    finally:
        db.drop()


def main() -> None:
    args = parse()
    sys.path.insert(0, str(ROOT))
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            runs[way].append(drain(args.dsn, way, args.n))
    out: dict = {"n": args.n, "rounds": args.rounds, "drain": {}}
    for way in WAYS:
        out["drain"][way] = {key: round(statistics.median(r[key] for r in runs[way]), 1) for key in runs[way][0]}
    base = out["drain"]["none"]["jobs_per_s"]
    for way in WAYS[1:]:
        out["drain"][way]["of_unlimited_pct"] = round(100 * out["drain"][way]["jobs_per_s"] / base, 1)
    out["backlog"] = {"jobs": args.backlog, "with": claim_latency(args.dsn, args.backlog, args.claims),
                      "without": claim_latency(args.dsn, 0, args.claims)}
    out["backlog"]["p50_ratio"] = round(out["backlog"]["with"]["p50_ms"] / out["backlog"]["without"]["p50_ms"], 3)
    if not args.json:
        for way in WAYS:
            d = out["drain"][way]
            print(f"{way:>5}: {d['jobs_per_s']:,.0f} jobs/s, {d['cpu_us_per_job']:,.0f} us CPU a job, enqueue "
                  f"{d['enqueue_per_s']:,.0f}/s" + (f" ({d['of_unlimited_pct']}% of unlimited)" if way != "none"
                                                     else ""))
        b = out["backlog"]
        print(f"claim with {b['jobs']:,} held back: p50 {b['with']['p50_ms']} ms, p95 {b['with']['p95_ms']} ms; "
              f"without: p50 {b['without']['p50_ms']} ms, p95 {b['without']['p95_ms']} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
