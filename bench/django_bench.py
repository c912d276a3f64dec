"""Django's tasks on pgfence: what ``Task.enqueue()`` costs over
``pgfence.enqueue``, and how long a no-op task takes from its enqueue to
SUCCESSFUL in an idle worker.

    .venv/bin/python bench/django_bench.py [--dsn ADMIN_DSN] [--calls 5000] [--rounds 4] [--latency 300] [--json]

Makes a scratch database on ``--dsn``'s server, migrated by ``manage.py
migrate`` of the example shop (examples/django), then:

1. Enqueue: ``--rounds`` rounds of ``--calls`` calls each of
   ``orders.tasks.noop.enqueue()`` and of ``pgfence.enqueue(conn,
   "orders.tasks.noop", {"args": [], "kwargs": {}}, queue=...,
   max_attempts=...)`` (the same job: the task's queue, the backend's
   ``MAX_ATTEMPTS``) on the same
   connection (Django's own, autocommit: one transaction per call, as a
   view that enqueues outside ``atomic()`` does), in blocks of 250 calls
   taken in turn (ABBA), so that the commits' varying cost falls on both;
   per way, the median of the rounds' calls/s and microseconds per call.
   The jobs are deleted between rounds.
2. Latency: a real ``manage.py pgfence run --workers 1``, idle; then
   ``--latency`` times, one at a time, enqueue a no-op task and wait until
   it is done; the latency is ``finished_at - created_at`` of its job, both
   on the database's clock (the enqueue's transaction start to the fenced
   completion's commit).  p50/p95/p99/max in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "examples" / "django"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--latency", type=int, default=300)
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def enqueue_rounds(calls: int, rounds: int) -> dict[str, list[float]]:
    """Calls/s of each way, per round, in this process (Django set up)."""
    from django.db import connection

    import pgfence
    from orders.tasks import noop

    connection.ensure_connection()
    raw = connection.connection
    attempts = noop.get_backend().max_attempts
    ways = {
        "Task.enqueue()": lambda: noop.enqueue(),
        # The same job: the task's queue and the backend's MAX_ATTEMPTS.
        "pgfence.enqueue": lambda: pgfence.enqueue(raw, "orders.tasks.noop", {"args": [], "kwargs": {}},
                                                   queue=noop.queue_name, max_attempts=attempts),
    }
    out: dict[str, list[float]] = {name: [] for name in ways}
    for call in ways.values():                 # warm: prepared plans, caches
        for _ in range(200):
            call()
    block = 250
    for n in range(rounds):
        spent = dict.fromkeys(ways, 0.0)
        raw.execute("DELETE FROM pgfence.jobs")
        # Blocks of 250 calls, the two ways in turn (ABBA), so that a
        # slower second of the disk's commits falls on both alike.
        for b in range(calls // block):
            order = list(ways) if b % 2 == 0 else list(reversed(ways))
            for name in order:
                call = ways[name]
                started = time.perf_counter()
                for _ in range(block):
                    call()
                spent[name] += time.perf_counter() - started
        for name in ways:
            out[name].append((calls // block) * block / spent[name])
    return out


def latency(samples: int, env: dict[str, str]) -> list[float]:
    """Enqueue-to-done latencies (ms) of no-op tasks into an idle worker."""
    from django.db import connection

    from orders.tasks import noop

    log = open(os.devnull, "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "manage.py", "pgfence", "run", "--workers", "1",
                             "--metrics-port", "0"], cwd=SHOP, env=env, stdout=log, stderr=log)
    try:
        raw = connection.connection
        out: list[float] = []
        first = noop.enqueue()              # the worker is up once this is done
        deadline = time.monotonic() + 60
        while raw.execute("SELECT count(*) FROM pgfence.job_history WHERE id = %s",
                          (int(first.id),)).fetchone()[0] == 0:
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not start")
            time.sleep(0.05)
        for _ in range(samples):
            time.sleep(0.05)                # idle again: waiting on its LISTEN
            job = int(noop.enqueue().id)
            while True:
                row = raw.execute("SELECT extract(epoch FROM finished_at - created_at) * 1000 "
                                  "FROM pgfence.job_history WHERE id = %s", (job,)).fetchone()
                if row:
                    out.append(float(row[0]))
                    break
                time.sleep(0.001)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    args = parse()
    name = f"pgfence_bench_django_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo("", **{**conninfo_to_dict(args.dsn), "dbname": name})
    env = {**os.environ, "PGFENCE_DSN": dsn, "PYTHONPATH": str(SHOP)}
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=SHOP, env=env, check=True)
        os.environ.update(PGFENCE_DSN=dsn, DJANGO_SETTINGS_MODULE="shop.settings")
        sys.path.insert(0, str(SHOP))
        import django

        django.setup()
        rates = enqueue_rounds(args.calls, args.rounds)
        waits = latency(args.latency, env)
        from django.db import connections

        connections.close_all()
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    medians = {way: statistics.median(r) for way, r in rates.items()}
    overhead = medians["pgfence.enqueue"] / medians["Task.enqueue()"] - 1
    report = {
        "enqueue": {way: {"calls_per_s": round(m), "us_per_call": round(1e6 / m, 1),
                          "rounds": [round(r) for r in rates[way]]} for way, m in medians.items()},
        "task_enqueue_overhead_pct": round(100 * overhead, 1),
        "latency_ms": {"samples": len(waits), "p50": round(pct(waits, 0.5), 2), "p95": round(pct(waits, 0.95), 2),
                       "p99": round(pct(waits, 0.99), 2), "max": round(max(waits), 2)},
    }
    if args.json:
        print(json.dumps(report))
        return
    for way, figures in report["enqueue"].items():
        print(f"{way:18} {figures['calls_per_s']:>8,} calls/s  {figures['us_per_call']:>7} us/call  "
              f"rounds {figures['rounds']}")
    print(f"Task.enqueue() over pgfence.enqueue: +{report['task_enqueue_overhead_pct']}%")
    lat = report["latency_ms"]
    print(f"enqueue -> SUCCESSFUL, idle worker, {lat['samples']} tasks: p50 {lat['p50']} ms, p95 {lat['p95']} ms, "
          f"p99 {lat['p99']} ms, max {lat['max']} ms")


if __name__ == "__main__":
    main()
