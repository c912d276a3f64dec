"""Steady drain of pgfence.jobs under each vacuum regime.

Each round makes a fresh database, migrates it, starts ``pgfence run
--workers 2 --batch 100`` on the builtin no-op handler and enqueues no-op
jobs at a steady rate (one INSERT every 100 ms) for the given minutes,
sampling every 10 s: jobs done per second, queue depth, and pgfence.jobs'
dead tuples, autovacuum and vacuum counts (pg_stat_user_tables).  The
variants alternate, so a busy machine slows them alike:

- ``tuned``: migration 0010's autovacuum settings, no self-vacuum;
- ``defaults``: the table's autovacuum options reset (fillfactor stays), no
  self-vacuum;
- ``self``: migration 0010's settings and pgfence's own VACUUM (the default
  ``self_vacuum_dead_tuples``).

On the embedded PostgreSQL 18 (autovacuum on, the server's defaults; its
data in ``--pgdata``, never the user's embedded server):

    .venv/bin/python bench/vacuum_steady.py --rate 4000 --minutes 4 --rounds 2 --variants tuned,defaults

On a server whose autovacuum is off:

    .venv/bin/python bench/vacuum_steady.py --dsn postgresql://postgres@127.0.0.1/postgres \
        --rate 4000 --minutes 4 --rounds 2 --variants self,tuned
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from pgfence.store import embedded

RESET = ("autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
         "autovacuum_vacuum_insert_threshold, autovacuum_vacuum_cost_delay, autovacuum_analyze_scale_factor, "
         "autovacuum_analyze_threshold, vacuum_truncate")
SAMPLE = """
SELECT (SELECT count(*) FROM pgfence.jobs WHERE status = 'queued'),
       (SELECT count(*) FROM pgfence.jobs WHERE status = 'running'),
       n_dead_tup, n_live_tup, autovacuum_count, vacuum_count
  FROM pg_stat_user_tables WHERE relid = 'pgfence.jobs'::regclass"""
#: Per variant: reset the table's autovacuum options, and pgfence run's extra flags.
VARIANTS = {"tuned": (False, ["--self-vacuum-dead-tuples", "none"]),
            "defaults": (True, ["--self-vacuum-dead-tuples", "none"]),
            "self": (False, [])}


def with_db(dsn: str, name: str) -> str:
    base, _, query = dsn.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")


def enqueue(dsn: str, rate: int, stop: threading.Event, count: list[int]) -> None:
    per_tick = max(1, rate // 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_at = time.monotonic()
        while not stop.is_set():
            conn.execute("INSERT INTO pgfence.jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, %s)",
                         (per_tick,))
            count[0] += per_tick
            next_at += 0.1
            stop.wait(max(0.0, next_at - time.monotonic()))


def one_round(admin_dsn: str, variant: str, index: int, rate: int, seconds: float,
              prefill: int = 0) -> dict[str, object]:
    name = f"pgfence_vacuum_{variant}_{index}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    dsn = with_db(admin_dsn, name)
    subprocess.run([sys.executable, "-m", "pgfence", "migrate", "--dsn", dsn], check=True, capture_output=True)
    reset, flags = VARIANTS[variant]
    with psycopg.connect(dsn, autocommit=True) as conn:
        if reset:
            conn.execute(f"ALTER TABLE pgfence.jobs RESET ({RESET})")
        if prefill:
            # Finished jobs kept for the retention, as a database in use
            # for days holds them (in history, since migration 0009);
            # vacuumed, as such tables would be.
            conn.execute("INSERT INTO pgfence.job_history (kind, payload, status, finished_at) "
                         "SELECT 'noop', '{}', 'done', now() FROM generate_series(1, %s)", (prefill,))
            conn.execute("VACUUM ANALYZE pgfence.jobs, pgfence.job_history")
    run = subprocess.Popen([sys.executable, "-m", "pgfence", "run", "--dsn", dsn, "--workers", "2", "--batch", "100",
                            "--handlers", "pgfence.handlers.builtin", "--metrics-port", "0", *flags],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    count = [0]
    samples = []
    try:
        time.sleep(2)
        feeder = threading.Thread(target=enqueue, args=(dsn, rate, stop, count), daemon=True)
        started = time.monotonic()
        feeder.start()
        last_done, last_at = 0, started
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() - started < seconds:
                time.sleep(10 - (time.monotonic() - started) % 10)
                queued, running, dead, live, autovacuums, vacuums = conn.execute(SAMPLE).fetchone()  # type: ignore[misc]
                now = time.monotonic()
                done = count[0] - queued - running
                samples.append({"t": round(now - started), "jobs_s": round((done - last_done) / (now - last_at)),
                                "queued": queued, "dead": dead, "live": live, "autovacuums": autovacuums,
                                "vacuums": vacuums})
                print(variant, index, samples[-1], flush=True)
                last_done, last_at = done, now
    finally:
        stop.set()
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
    rates = [s["jobs_s"] for s in samples]
    return {"variant": variant, "round": index, "rate": rate, "mean_jobs_s": round(sum(rates) / len(rates)),
            "max_dead": max(s["dead"] for s in samples), "final_queue": samples[-1]["queued"],
            "autovacuums": samples[-1]["autovacuums"], "vacuums": samples[-1]["vacuums"], "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--minutes", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="tuned,defaults", help=f"two or more of {', '.join(VARIANTS)}")
    parser.add_argument("--prefill", type=int, default=0, help="finished jobs in the table before the drain")
    parser.add_argument("--dsn", default=None, help="an admin DSN of a server (default: the embedded one)")
    parser.add_argument("--pgdata", default="/tmp/pgfence-vacuum-bench/pgdata")
    parser.add_argument("--json", default=None, help="write every sample here")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r} (known: {', '.join(VARIANTS)})")
    admin_dsn = args.dsn or embedded.start(Path(args.pgdata))
    results = []
    for index in range(args.rounds):
        for variant in variants if index % 2 == 0 else variants[::-1]:
            results.append(one_round(admin_dsn, variant, index, args.rate, args.minutes * 60, args.prefill))
    print("| variant | round | offered/s | mean done/s | max dead tuples | queue at end | autovacuums | vacuums |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['variant']} | {r['round']} | {r['rate']} | {r['mean_jobs_s']} | {r['max_dead']} | "
              f"{r['final_queue']} | {r['autovacuums']} | {r['vacuums']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.dsn:
        embedded.stop(Path(args.pgdata))


if __name__ == "__main__":
    main()
