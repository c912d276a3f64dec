"""A bulk retry of a million failed jobs from the dashboard, with workers
claiming a steady stream meanwhile.

    .venv/bin/python bench/bulk_retry.py --dsn postgresql://postgres@127.0.0.1:5432/postgres --jobs 1000000

``--dsn`` names a server (and a database to connect to first): the script
makes a scratch database there, migrated, and drops it at the end.

1. Seeds ``--jobs`` failed jobs of queue ``bulk`` with one ``INSERT ...
   SELECT generate_series`` into ``pgfence.job_history``, where a final
   failure leaves a job (retry moves it back to ``pgfence.jobs`` under its
   own id), then VACUUM ANALYZE.
2. Starts a real ``pgfence run --queues stream --workers 1`` (no-op
   handler) and a producer that enqueues ``noop`` jobs on queue ``stream``
   at ``--rate`` jobs/s (default 200), one transaction each, paced by the
   clock.  The worker serves ``stream`` alone: the retried jobs of ``bulk``
   stay queued, unclaimed, so the stream's latency is all that is measured.
3. Starts the dashboard (``create_app`` served by uvicorn in a process of
   its own, bulk batch ``--batch``), and after ``--before`` seconds of the
   stream asks it, over HTTP as a browser does, for the confirmation page
   of "retry every failed job of queue bulk" (its count), then POSTs the
   form with its CSRF token: the time of that response is the first figure.
4. Follows the action's row until it is done (progress every second), then
   lets the stream run ``--after`` seconds more.

Claim latency is read from the stream's own jobs: ``started_at -
created_at`` (the claim's clock minus the enqueue's), before the POST and
while the action ran (the action's own started_at and finished_at, on the
database's clock), as p50/p95/p99/max.  With ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from scratch import scratch_database

from pgfence import enqueue
from pgfence.store.queries import q
from pgfence.web.bulk import REST

ROOT = Path(__file__).resolve().parent.parent

SEED = """
INSERT INTO pgfence.job_history (status, queue, kind, last_error, attempt, max_attempts, created_at, run_at,
                                 started_at, finished_at, worker, payload)
SELECT 'failed', 'bulk', 'noop', 'RuntimeError: upstream 503', 1, 1, t - interval '1 minute',
       t - interval '1 minute', t - interval '1 second', t, 'bench:1:w', jsonb_build_object('n', g)
  FROM generate_series(1, %(jobs)s) g,
       LATERAL (SELECT now() - interval '1 hour' + g * (interval '1 hour' / %(jobs)s)) AS spread(t)"""

TIMELINE = """
SELECT floor(extract(epoch FROM created_at - %(since)s))::int AS second, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), max(ms)
  FROM (SELECT created_at, extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms
          FROM pgfence.all_jobs
         WHERE queue = 'stream' AND started_at IS NOT NULL AND created_at >= %(since)s AND created_at < %(until)s) s
 GROUP BY 1 ORDER BY 1"""

LATENCY = """
SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms), max(ms)
  FROM (SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms
          FROM pgfence.all_jobs
         WHERE queue = 'stream' AND started_at IS NOT NULL AND created_at >= %(since)s AND created_at < %(until)s) s"""

SERVER = """
import sys, uvicorn
from pgfence.web.app import create_app
uvicorn.run(create_app(sys.argv[1], bulk_batch=int(sys.argv[3]), bulk_rest=float(sys.argv[4])), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning")
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stream(threading.Thread):
    """Enqueues a noop job on queue ``stream`` every 1/rate s, each in its
    own transaction, on its own connection."""

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(name="stream", daemon=True)
        self.dsn, self.period = dsn, 1.0 / rate
        self.stop = threading.Event()
        self.sent = 0
        self.late = 0
        #: (monotonic time, seconds) of each enqueue call.
        self.calls: list[tuple[float, float]] = []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            due = time.monotonic()
            while not self.stop.is_set():
                began = time.monotonic()
                enqueue(conn, "noop", queue="stream")
                self.calls.append((began, time.monotonic() - began))
                self.sent += 1
                due += self.period
                wait = due - time.monotonic()
                if wait > 0:
                    self.stop.wait(wait)
                else:
                    self.late += 1


def latency(conn: psycopg.Connection, since: Any, until: Any) -> dict[str, float]:
    row = conn.execute(LATENCY, {"since": since, "until": until}).fetchone()
    assert row is not None
    count, (p50, p95, p99), most = row[0], row[1] or (None, None, None), row[2]
    return {"jobs": int(count), "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "max_ms": most}


def explain_batch(conn: psycopg.Connection, batch: int) -> dict[str, list[str]]:
    """The plans of one batch of the runner, as it runs them (its first
    batch: the newest failed jobs), executed and rolled back."""
    where = {"before": None, "upto": None, "id": None, "queue": "bulk", "kind": None, "status": "failed",
             "dedupe_key": None, "error": None, "statuses": ["failed", "cancelled"], "limit": batch}
    plans: dict[str, list[str]] = {}
    with conn.transaction(force_rollback=True):
        page = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + q("web_jobs_page"), where)]
        ids = [r[0] for r in conn.execute(q("web_jobs_page"), where)]
        retry = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + q("retry"),
                                            {"ids": ids, "all_failed": False, "extra_attempts": 1})]
        plans = {"keyset read": page, "retry": retry}
    # The batch's 500 ids, written out in every node that reads them: one mark instead.
    return {name: [re.sub(r"'\{[0-9,]{40,}\}'", f"'{{...{len(ids)} ids...}}'", line) for line in plan]
            for name, plan in plans.items()}


def hidden_fields(page: str) -> dict[str, str]:
    import html

    form = page.split('id="confirm"')[1]
    return {k: html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="the server (a scratch database is made there and dropped)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="failed jobs to retry")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs/s of the stream the worker claims")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the pgfence run")
    parser.add_argument("--batch", type=int, default=500, help="jobs per transaction of the bulk action")
    parser.add_argument("--rest", type=float, default=None,
                        help="the runner rests this many times a batch's duration after it (default: the dashboard's)")
    parser.add_argument("--before", type=float, default=15.0, help="seconds of stream before the POST")
    parser.add_argument("--after", type=float, default=5.0, help="seconds of stream after the action")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--explain", action="store_true",
                        help="also, EXPLAIN (ANALYZE, BUFFERS, WAL) of one batch's two statements (the keyset read "
                             "and the retry), rolled back, before the run")
    parser.add_argument("--timeline", action="store_true",
                        help="also, per second of the action: the stream's jobs, their median and largest claim "
                             "latency, and the longest enqueue call")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGFENCE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with scratch_database(args.dsn, None) as conn:
        dsn = conn.info.dsn
        env["PGFENCE_DSN"] = dsn
        log(f"seeding {args.jobs:,} failed jobs into pgfence.job_history")
        began = time.monotonic()
        conn.execute(SEED, {"jobs": args.jobs})
        seed_s = time.monotonic() - began
        conn.execute("VACUUM ANALYZE pgfence.job_history")
        log(f"seeded in {seed_s:.1f} s (then VACUUM ANALYZE)")
        explained = explain_batch(conn, args.batch) if args.explain else None

        # ERROR: the builtin handlers' kinds of other queues each get a warning.
        worker = subprocess.Popen([sys.executable, "-m", "pgfence", "run", "--queues", "stream",
                                   "--workers", str(args.workers), "--handlers", "pgfence.handlers.builtin",
                                   "--metrics-port", "0", "--log-level", "ERROR"], env=env, cwd=ROOT)
        port = free_port()
        web = subprocess.Popen([sys.executable, "-c", SERVER, dsn, str(port), str(args.batch),
                                str(REST if args.rest is None else args.rest)], env=env, cwd=ROOT)
        stream = Stream(dsn, args.rate)
        result: dict[str, Any] = {"jobs": args.jobs, "rate": args.rate, "batch": args.batch, "seed_s": seed_s}
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=120) as http:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if http.get("/").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit("the dashboard did not answer within 30 s")
                    time.sleep(0.1)
                stream.start()
                stream_began = conn.execute("SELECT now()").fetchone()[0]
                log(f"stream of {args.rate:g} jobs/s on queue stream; the POST in {args.before:g} s")
                time.sleep(args.before)

                began = time.monotonic()
                confirm = http.get("/jobs/bulk", params={"action": "retry", "queue": "bulk", "status": "failed"})
                result["confirm_s"] = time.monotonic() - began
                assert confirm.status_code == 200, confirm.text
                form = hidden_fields(confirm.text)
                began = time.monotonic()
                posted = time.monotonic()
                response = http.post("/jobs/bulk", data=form, follow_redirects=False)
                result["post_s"] = time.monotonic() - began
                assert response.status_code == 303, response.text
                action_id = int(response.headers["location"].rsplit("/", 1)[1])
                log(f"POST answered {response.status_code} in {result['post_s'] * 1000:.1f} ms "
                    f"(the confirmation's count: {result['confirm_s'] * 1000:.0f} ms); operation {action_id}")
                page_ms = []
                while True:
                    row = conn.execute("SELECT state, matched, acted, left_alone, batches, started_at, finished_at "
                                       "FROM pgfence.bulk_actions WHERE id = %s", (action_id,)).fetchone()
                    assert row is not None
                    state, matched, acted, left_alone, batches, started_at, finished_at = row
                    if state != "running":
                        break
                    began = time.monotonic()
                    page = http.get(f"/operations/{action_id}")
                    page_ms.append((time.monotonic() - began) * 1000)
                    assert page.status_code == 200, page.text
                    log(f"{acted:,} of {matched if matched is not None else '?'} retried, {batches} batches")
                    time.sleep(1.0)
                log(f"operation {state}: {acted:,} retried, {left_alone} left alone, {batches} batches")
                time.sleep(args.after)
            stream.stop.set()
            stream.join()
            # Every job of the stream claimed before its latency is read.
            deadline = time.monotonic() + 60
            while conn.execute("SELECT count(*) FROM pgfence.jobs WHERE queue = 'stream'").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("the stream's jobs were not all claimed within 60 s")
                time.sleep(0.2)
            duration = (finished_at - started_at).total_seconds()
            result.update({
                "state": state, "matched": matched, "acted": acted, "left_alone": left_alone, "batches": batches,
                "duration_s": duration, "rows_per_s": acted / duration if duration else None,
                "page_ms_median": sorted(page_ms)[len(page_ms) // 2] if page_ms else None,
                "stream_sent": stream.sent, "stream_late": stream.late,
                "latency_before": latency(conn, stream_began, started_at),
                "latency_during": latency(conn, started_at, finished_at),
                "retried_queued": conn.execute("SELECT count(*) FROM pgfence.jobs WHERE queue = 'bulk'").fetchone()[0],
                "enqueue_ms_max_during": 1000 * max((d for t, d in stream.calls if t >= posted), default=0.0),
            })
            if args.timeline:
                slowest: dict[int, float] = {}
                for t, d in stream.calls:
                    if t >= posted:
                        slowest[int(t - posted)] = max(slowest.get(int(t - posted), 0.0), d * 1000)
                result["timeline"] = [
                    {"second": sec, "jobs": n, "p50_ms": p50, "max_ms": most, "enqueue_max_ms": slowest.get(sec)}
                    for sec, n, p50, most in conn.execute(TIMELINE, {"since": started_at, "until": finished_at})]
        finally:
            stream.stop.set()
            for proc in (web, worker):
                proc.send_signal(signal.SIGTERM)
            for proc in (web, worker):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    if explained is not None:
        result["explain"] = explained
    if args.json:
        print(json.dumps(result, default=str))
        return
    print(f"bulk retry of {result['acted']:,} failed jobs (batch {args.batch}), stream {args.rate:g} jobs/s")
    print(f"  seed: {seed_s:.1f} s; confirmation (count): {result['confirm_s'] * 1000:.0f} ms; "
          f"POST answered in {result['post_s'] * 1000:.1f} ms")
    print(f"  operation: {result['state']}, {result['acted']:,} acted, {result['left_alone']} left alone, "
          f"{result['batches']} batches, {result['duration_s']:.1f} s, {result['rows_per_s']:,.0f} rows/s; "
          f"its page {result['page_ms_median']:.1f} ms (median)")
    print(f"  queued in pgfence.jobs after: {result['retried_queued']:,}")
    print("  claim latency of the stream (ms): window | jobs | p50 | p95 | p99 | max")
    for window in ("before", "during"):
        lat = result[f"latency_{window}"]
        print(f"    {window} | {lat['jobs']} | {lat['p50_ms']:.2f} | {lat['p95_ms']:.2f} | {lat['p99_ms']:.2f} | "
              f"{lat['max_ms']:.2f}")
    print(f"  the stream's longest enqueue call during the action: {result['enqueue_ms_max_during']:.1f} ms "
          f"({result['stream_late']} enqueues late of {result['stream_sent']})")
    for name, plan in result.get("explain", {}).items():
        print(f"  EXPLAIN (ANALYZE, BUFFERS, WAL) of one batch's {name}:")
        print("\n".join(f"    {line}" for line in plan))
    for row in result.get("timeline", []):
        print(f"    s{row['second']:>4}: {row['jobs']:>4} jobs, latency p50 {row['p50_ms']:8.2f} max "
              f"{row['max_ms']:8.2f} ms, enqueue max {row['enqueue_max_ms'] or 0:8.2f} ms")


if __name__ == "__main__":
    main()
