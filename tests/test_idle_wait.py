"""Idle workers wake when the next job is due (issue 9, point 7): a retry
after its backoff, a delayed job at its run_at, without waiting for the
poll interval; the look-up of the next run_at stays cheap."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess

import psycopg

import pgfence.handlers.builtin  # noqa: F401 - registers noop, sleep, fail before the registry snapshot
from pgtools import env_for, job_row, pgfence, scalar, spawn, wait_for
from pgfence.store.queries import q

#: Far longer than any deadline below: a job that waits for the poll fails.
POLL = "60"
IDLE = re.compile(r"DEBUG pgfence\.worker: worker w-idle idle: next run_at in (none|[0-9.]+s), next lease end in \S+, "
                  r"sleeping up to ([0-9.]+)s$")


def idle_worker(conn, dsn: str, **env: str) -> subprocess.Popen:
    """A `pgfence work` with a 60 s poll interval, once it waits idle."""
    proc = spawn("work", "--name", "w-idle", "--poll-interval", POLL, "--log-level", "DEBUG",
                 "--handlers", "pgfence.handlers.builtin,rollout_handlers", env=env_for(dsn, **env),
                 stdout=subprocess.DEVNULL)
    wait_idle(conn, "w-idle")
    return proc


def wait_idle(conn, name: str) -> None:
    """Until worker ``name`` waits idle: its session idle after its LISTEN,
    a claim or a look-up of the next run_at or lease end."""
    wait_for(lambda: scalar(conn, """
        SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'pgfence worker ' || %s AND state = 'idle'
           AND (query IN ('LISTEN pgfence_jobs', 'LISTEN pgfence_pauses') OR query LIKE 'WITH candidates%%'
                OR query LIKE 'WITH RECURSIVE priorities%%' OR query LIKE 'SELECT queue%%FROM pgfence.queue_pauses%%'
                OR query LIKE 'SELECT extract(epoch FROM min(r.lease_until)%%')""", (name,)) == 1,
             timeout=20, message=f"worker {name} waiting idle")


def stop(proc: subprocess.Popen) -> list[tuple[str, float]]:
    """Stop the worker; its idle sleeps as (next run_at, seconds slept at most)."""
    proc.terminate()
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return [(m.group(1), float(m.group(2))) for m in map(IDLE.search, err.splitlines()) if m]


def test_a_retry_runs_after_its_backoff_not_after_the_poll_interval(dsn, conn):
    proc = idle_worker(conn, dsn, PGFENCE_BACKOFF_BASE="0.2")
    try:
        job_id = scalar(conn, "SELECT pgfence.enqueue('fail_first', '{}')")
        wait_for(lambda: job_row(conn, job_id)["status"] == "done", timeout=15,
                 message="the job done on its second attempt (a poll would take 60 s)")
    finally:
        sleeps = stop(proc)
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["last_error"]) == \
        ("done", 2, "RuntimeError: the first attempt fails on purpose")
    assert row["started_at"] >= row["run_at"]          # not claimed before its backoff ran out
    # After the failure the worker slept until the retry's run_at (a backoff
    # of 0.1 to 0.2 s), not for the 60 s poll interval.
    assert any(until != "none" and 0 < slept <= 0.21 for until, slept in sleeps), sleeps


def test_a_delayed_job_wakes_the_worker_at_its_run_at(dsn, conn):
    proc = idle_worker(conn, dsn)
    try:
        out = pgfence("enqueue", "noop", "--delay", "1.5", dsn=dsn)
        assert out.returncode == 0, out.stderr
        job_id = int(out.stdout)
        wait_for(lambda: job_row(conn, job_id)["status"] == "done", timeout=15,
                 message="the delayed job done (a poll would take 60 s)")
    finally:
        sleeps = stop(proc)
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("done", 1)
    assert row["started_at"] >= row["run_at"]
    # The enqueue's NOTIFY woke the worker 1.5 s early: it found nothing to
    # claim and went back to sleep until the run_at, not for the poll interval.
    assert sleeps[0] == ("none", 60.0)
    assert any(until != "none" and 0.5 < slept <= 1.6 for until, slept in sleeps[1:]), sleeps


def test_idle_wait_follows_the_earliest_future_run_at_of_the_queues_served(conn, make_worker):
    worker = make_worker("w-wait", queues=("a", "b"), poll_interval=40.0)
    assert worker.idle_wait() == 40.0                  # nothing queued: the poll interval
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'a', 0, now() + interval '30 seconds')")
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'b', 5, now() + interval '20 seconds')")
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'other', 0, now() + interval '2 seconds')")
    assert 19 < worker.idle_wait() <= 20.01
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'a', -3, now() + interval '10 seconds')")
    assert 9 < worker.idle_wait() <= 10.01
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'b', 0, now() + interval '2 hours')")
    assert 9 < worker.idle_wait() <= 10.01
    # A job already due but locked by a claim in flight is not waited for:
    # it would make an idle worker spin.
    due = scalar(conn, "SELECT pgfence.enqueue('noop', '{}', 'a', 9)")
    with psycopg.connect(conn.info.dsn) as other:
        other.execute("SELECT 1 FROM pgfence.jobs WHERE id = %s FOR UPDATE", (due,))
        assert worker.claim() == []
        assert 9 < worker.idle_wait() <= 10.01
    # Past the poll interval: the poll interval.
    conn.execute("DELETE FROM pgfence.jobs WHERE run_at < now() + interval '1 hour'")
    assert worker.idle_wait() == 40.0


def test_the_next_run_at_look_up_reads_a_few_pages_with_100k_delayed_jobs(conn):
    conn.execute("""
        INSERT INTO pgfence.jobs (kind, queue, priority, run_at)
        SELECT 'noop', 'default', g % 4, now() + make_interval(secs => 60 + g % 5000)
          FROM generate_series(1, 100000) g""")
    conn.execute("ANALYZE pgfence.jobs")
    params = {"queues": ["default", "other"]}
    with conn.transaction():    # one now() for both
        assert scalar(conn, q("next_run_at"), params) == \
            scalar(conn, "SELECT extract(epoch FROM min(run_at) - now())::float8 FROM pgfence.all_jobs")
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("next_run_at"), params).fetchone()[0][0]

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    every = list(nodes(plan["Plan"]))
    assert {n["Node Type"] for n in every} & {"Seq Scan", "Sort", "Bitmap Heap Scan"} == set(), json.dumps(plan)
    # The queued jobs' index, and the (empty) one of jobs a concurrency
    # limit holds until their run_at.
    assert {n.get("Index Name") for n in every if "Index Name" in n} == {"jobs_queued_idx", "jobs_held_scheduled_idx"}
    # Four priorities: a handful of descents of the index, not 100k entries
    # (a full scan of the index alone is several hundred pages).
    assert plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"] < 150, json.dumps(plan)


# -- expired leases (issue 10, point 11) -------------------------------------------


def test_a_dead_workers_job_is_reclaimed_when_its_lease_ends_not_at_the_next_poll(dsn, conn):
    """Worker A is SIGKILLed in the middle of a job; idle worker B, whose
    poll interval is 20 s, wakes when the lease A last renewed runs out and
    reclaims the job within about a second of it."""
    lease = 3.0
    common = ("--poll-interval", "20", "--lease", str(lease), "--handlers", "pgfence.handlers.builtin")
    a = spawn("work", "--name", "w-a", *common, dsn=dsn, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    b = None
    try:
        job_id = scalar(conn, """SELECT pgfence.enqueue('sleep', '{"seconds": 120}')""")
        wait_for(lambda: job_row(conn, job_id)["locked_by"] == "w-a", timeout=20, message="worker A running the job")
        b = spawn("work", "--name", "w-b", *common, dsn=dsn, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_idle(conn, "w-b")
        a.kill()
        a.wait(timeout=10)
        lease_until = job_row(conn, job_id)["lease_until"]   # A renews no more
        # A poll would reclaim it up to 20 s later.
        wait_for(lambda: job_row(conn, job_id)["locked_by"] == "w-b", timeout=lease + 2.5,
                 message="worker B reclaiming the job about when its lease ran out")
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["reclaims"]) == ("running", 2, 1)
        assert lease_until <= row["started_at"] <= lease_until + dt.timedelta(seconds=1.5)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_the_next_lease_end_look_up_reads_running_jobs_only(conn):
    conn.execute("""
        INSERT INTO pgfence.jobs (kind, queue, priority, run_at)
        SELECT 'noop', 'default', g % 4, now() - make_interval(secs => g % 5000)
          FROM generate_series(1, 100000) g""")
    conn.execute("""
        UPDATE pgfence.jobs SET status = 'running', attempt = 1, started_at = now(), locked_by = 'w',
               lease_until = now() + make_interval(secs => 10 + id % 50)
         WHERE id <= 50""")
    # Finished jobs leave pgfence.jobs: half of the rest are gone from it.
    conn.execute("DELETE FROM pgfence.jobs WHERE id > 50 AND id <= 50000")
    conn.execute("ANALYZE pgfence.jobs")
    params = {"queues": ["default", "other"]}
    with conn.transaction():    # one now() for both
        assert scalar(conn, q("next_lease_end"), params) == scalar(conn, """
            SELECT extract(epoch FROM min(lease_until) - now())::float8 FROM pgfence.all_jobs WHERE status = 'running'""")
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("next_lease_end"), params).fetchone()[0][0]

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    every = list(nodes(plan["Plan"]))
    assert {n["Node Type"] for n in every} & {"Seq Scan", "Bitmap Heap Scan"} == set(), json.dumps(plan)
    assert {n.get("Index Name") for n in every if "Index Name" in n} == {"jobs_running_idx"}
    # The 50 running jobs' index entries and heap pages, not 100k rows.
    assert plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"] < 80, json.dumps(plan)
