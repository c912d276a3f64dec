"""Claim: which jobs a worker gets, in what order, and what the claim stamps
on them (attempt, owner, lease by the database clock)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from prometheus_client import REGISTRY

import pgfence.handlers.builtin  # noqa: F401 - registers noop & co. before the registry snapshot
from pgtools import job_row, scalar, wait_for
from pgfence import enqueue, handler
from pgfence.store.queries import q
from pgfence.worker.engine import Worker


def claim_params(worker: str = "sql", *, queues=("default",), batch: int = 1, lease: float = 30.0,
                 lease_kinds=(), lease_secs=(), reclaim: bool = True, kinds=None, not_kinds=None) -> dict:
    return {"queues": list(queues), "batch": batch, "worker": worker, "lease": lease,
            "lease_kinds": list(lease_kinds), "lease_secs": list(lease_secs), "reclaim": reclaim,
            "kinds": None if kinds is None else list(kinds),
            "not_kinds": None if not_kinds is None else list(not_kinds)}


def clock(conn: psycopg.Connection) -> dt.datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def wait_lease_expired(conn: psycopg.Connection, job_id: int) -> None:
    """Until the database clock has passed the job's lease_until."""
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (job_id,)),
             timeout=10, message=f"lease of job {job_id} to expire")


def test_claim_order_is_priority_then_run_at_then_id(conn, make_worker):
    base = scalar(conn, "SELECT now() - interval '1 hour'")
    # (priority, run_at offset in seconds); duplicates make id the tie-break.
    specs = [(0, 10), (5, 30), (5, 20), (0, 10), (-1, 0), (5, 20), (10, 50), (0, 5)]
    ids = [enqueue(conn, "noop", {"i": i}, priority=p, run_at=base + dt.timedelta(seconds=off))
           for i, (p, off) in enumerate(specs)]
    expected = [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-specs[i][0], specs[i][1], ids[i]))]
    assert expected != ids  # the order is not just insertion order

    worker = make_worker()
    claimed = []
    for _ in ids:
        jobs = worker.claim(1)
        assert len(jobs) == 1
        claimed.append(jobs[0].id)
    assert claimed == expected
    assert worker.claim(1) == []


def test_batch_claims_the_best_n_in_order(conn, make_worker):
    priorities = [1, 3, 2, 3, 0, 2]
    ids = [enqueue(conn, "noop", priority=p) for p in priorities]
    worker = make_worker("w-batch", batch=4)

    first = worker.claim()          # settings.batch = 4
    assert [j.id for j in first] == [ids[1], ids[3], ids[2], ids[5]]
    second = worker.claim()
    assert [j.id for j in second] == [ids[0], ids[4]]
    assert worker.claim() == []
    assert worker.claim(batch=10) == []

    rows = [job_row(conn, i) for i in ids]
    assert [(r["status"], r["attempt"], r["locked_by"]) for r in rows] == [("running", 1, "w-batch")] * 6
    assert worker.stats.claimed == 6


def test_claim_only_from_the_given_queues(conn, make_worker):
    alpha = enqueue(conn, "noop", queue="alpha")
    beta = enqueue(conn, "noop", queue="beta")
    default = enqueue(conn, "noop")

    worker = make_worker("w-ag", queues=("alpha", "gamma"))
    assert [(j.id, j.queue) for j in worker.claim(10)] == [(alpha, "alpha")]
    assert worker.claim(10) == []
    assert [(job_row(conn, i)["status"], job_row(conn, i)["attempt"]) for i in (beta, default)] == \
        [("queued", 0), ("queued", 0)]

    other = make_worker("w-bd", queues=("beta", "default"))
    assert sorted(j.id for j in other.claim(10)) == [beta, default]
    assert job_row(conn, alpha)["locked_by"] == "w-ag"
    assert job_row(conn, beta)["locked_by"] == "w-bd"


def test_delayed_job_is_not_claimed_until_due(conn, make_worker):
    later = scalar(conn, "SELECT pgfence.enqueue('noop', '{}', 'default', 9, now() + interval '1 hour')")
    soon = scalar(conn, "SELECT pgfence.enqueue('noop', '{}', 'default', 0, now() + interval '400 ms')")
    worker = make_worker()

    jobs = wait_for(lambda: worker.claim(5), timeout=10, message="the delayed job to become due")
    assert [j.id for j in jobs] == [soon]
    row = job_row(conn, soon)
    # Claimed no earlier than its run_at, by the database clock.
    assert row["started_at"] >= row["run_at"]
    assert (row["status"], row["attempt"]) == ("running", 1)
    # The job an hour away (despite its higher priority) stays queued.
    assert worker.claim(5) == []
    assert (job_row(conn, later)["status"], job_row(conn, later)["attempt"]) == ("queued", 0)


def test_claim_bumps_attempt_and_stamps_owner_and_lease_by_db_clock(conn, make_worker):
    job_id = enqueue(conn, "noop", {"a": 1})
    worker = make_worker("w-stamp", lease=12.5)

    before = clock(conn)
    [job] = worker.claim()
    after = clock(conn)

    row = job_row(conn, job_id)
    assert (job.id, job.attempt, job.kind, job.queue, job.payload) == (job_id, 1, "noop", "default", {"a": 1})
    assert job.lease.seconds == 12.5 and job.lease.attempt == 1
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("running", 1, 0, "w-stamp")
    assert row["finished_at"] is None
    assert before <= row["started_at"] <= after
    # lease_until = now() + lease, with now() the claim statement's clock.
    assert row["lease_until"] == row["started_at"] + dt.timedelta(seconds=12.5)


def test_prev_status_tells_reclaims_apart(conn, make_worker):
    job_id = enqueue(conn, "noop")
    rows = conn.execute(q("claim"), claim_params("first", lease=0.2)).fetchall()
    assert [(r[0], r[4], r[5], r[14]) for r in rows] == [(job_id, "running", 1, "queued")]

    wait_lease_expired(conn, job_id)
    rows = conn.execute(q("claim"), claim_params("second", lease=30)).fetchall()
    assert [(r[0], r[4], r[5], r[7], r[14]) for r in rows] == [(job_id, "running", 2, 1, "running")]
    row = job_row(conn, job_id)
    assert (row["locked_by"], row["attempt"], row["reclaims"]) == ("second", 2, 1)


def test_worker_counts_reclaims(conn, make_worker):
    job_id = enqueue(conn, "noop", queue="rq")
    labels = {"queue": "rq", "kind": "noop"}
    metric_before = REGISTRY.get_sample_value("pgfence_reclaims_total", labels) or 0.0

    first = make_worker("w-a", lease=0.2, queues=("rq",))
    [old] = first.claim()
    assert (first.stats.claimed, first.stats.reclaimed) == (1, 0)
    second = make_worker("w-b", queues=("rq",))
    [new] = wait_for(second.claim, timeout=10, message="the reclaim")
    assert (new.id, old.attempt, new.attempt) == (job_id, 1, 2)
    assert (second.stats.claimed, second.stats.reclaimed) == (1, 1)
    assert REGISTRY.get_sample_value("pgfence_reclaims_total", labels) == metric_before + 1
    assert job_row(conn, job_id)["locked_by"] == "w-b"


def test_per_kind_lease_option(conn, make_worker):
    @handler("t_long_lease", lease=120)
    def long_lease(job):
        pass

    long_id = enqueue(conn, "t_long_lease", priority=1)
    short_id = enqueue(conn, "noop")
    worker = make_worker("w-kinds", lease=10)
    jobs = {j.id: j for j in worker.claim(2)}

    assert sorted(jobs) == sorted([long_id, short_id])
    assert (jobs[long_id].lease.seconds, jobs[short_id].lease.seconds) == (120, 10)
    for job_id, seconds in ((long_id, 120), (short_id, 10)):
        row = job_row(conn, job_id)
        assert row["lease_until"] - row["started_at"] == dt.timedelta(seconds=seconds)


def test_skip_locked_second_claimer_skips_a_row_being_claimed(dsn, conn, make_worker):
    ids = [enqueue(conn, "noop") for _ in range(3)]
    with psycopg.connect(dsn) as holder:       # not autocommit: the claim stays uncommitted
        rows = holder.execute(q("claim"), claim_params("holder")).fetchall()
        assert [r[0] for r in rows] == [ids[0]]

        other = make_worker("w-other")
        # Without SKIP LOCKED this would wait on the holder's row lock.
        other.conn.execute("SET lock_timeout = '5s'")
        assert [j.id for j in other.claim(1)] == [ids[1]]
        holder.commit()

    assert [(job_row(conn, i)["locked_by"], job_row(conn, i)["attempt"]) for i in ids] == \
        [("holder", 1), ("w-other", 1), (None, 0)]


def test_concurrent_claimers_never_get_the_same_job(conn, make_worker):
    count, threads = 150, 6
    conn.execute("INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, %s)", (count,))
    ids = [r[0] for r in conn.execute("SELECT id FROM pgfence.all_jobs ORDER BY id")]
    workers = [make_worker(f"c{n}") for n in range(threads)]
    for w in workers:
        w.conn  # connect before the race starts
    got: dict[str, list[int]] = {w.name: [] for w in workers}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def run(worker: Worker) -> None:
        try:
            barrier.wait()
            while True:
                jobs = worker.claim(1 + len(got[worker.name]) % 3)
                if not jobs:
                    return
                got[worker.name].extend(j.id for j in jobs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert errors == []
    claimed = [i for lst in got.values() for i in lst]
    assert len(claimed) == count and sorted(claimed) == ids
    rows = conn.execute("SELECT id, status, attempt, locked_by FROM pgfence.all_jobs ORDER BY id").fetchall()
    owner = {i: name for name, lst in got.items() for i in lst}
    assert rows == [(i, "running", 1, owner[i]) for i in ids]


def _scans(node: dict) -> list[dict]:
    found = [node] if node.get("Relation Name") == "jobs" and "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


def test_a_claim_reads_a_batch_not_the_whole_queue(conn):
    # 20,000 queued jobs in two queues: each queue is read in index order and
    # the scan stops after the batch, instead of reading and sorting them all.
    conn.execute("INSERT INTO pgfence.jobs (kind, queue, priority) "
                 "SELECT 'noop', CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g % 3 FROM generate_series(1, 20000) g")
    conn.execute("ANALYZE pgfence.jobs")
    params = claim_params(queues=("a", "b"), batch=10)
    with conn.transaction(force_rollback=True):   # EXPLAIN ANALYZE runs the UPDATE
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q("claim"), params).fetchone()[0][0]["Plan"]
        scans = _scans(plan)
        read = sum(s["Actual Rows"] * s.get("Actual Loops", 1) for s in scans
                   if s.get("Index Name") == "jobs_queued_idx")
        assert any(s.get("Index Name") == "jobs_queued_idx" for s in scans), scans
        # At most a batch per queue (plus the rows skipped as locked: none here).
        assert read <= 2 * 10, read
    # And the order is still priority first across both queues.
    rows = conn.execute(q("claim"), params).fetchall()
    assert [r[9] for r in rows] == [2] * 10


def test_running_jobs_cost_a_claim_nothing_unless_it_looks_for_expired_leases(conn):
    """500 running jobs (leases valid) sort before the 5 queued ones (and
    20,000 queued on another queue make the table big enough for index
    scans; finished ones no longer live in it): a claim
    without reclaim reads the 5 queued rows alone; with reclaim it also
    walks the running jobs, finds none expired, and claims the same 5."""
    conn.execute("""INSERT INTO pgfence.jobs (kind, status, attempt, run_at, lease_until, locked_by)
                    SELECT 'noop', 'running', 1, now() - interval '1 hour', now() + interval '1 hour', 'busy'
                      FROM generate_series(1, 500)""")
    conn.execute("""INSERT INTO pgfence.jobs (kind, queue)
                    SELECT 'noop', 'other' FROM generate_series(1, 20000)""")
    queued = [enqueue(conn, "noop") for _ in range(5)]
    conn.execute("ANALYZE pgfence.jobs")

    def profile(reclaim: bool) -> tuple[dict, list[int]]:
        params = claim_params(batch=5, reclaim=reclaim)
        with conn.transaction(force_rollback=True):      # EXPLAIN ANALYZE runs the UPDATE
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q("claim"), params).fetchone()[0][0]["Plan"]
        with conn.transaction(force_rollback=True):
            claimed = sorted(r[0] for r in conn.execute(q("claim"), params))
        rows = {}
        for s in _scans(plan):
            name = s.get("Index Name")
            rows[name] = rows.get(name, 0) + (s["Actual Rows"] + s.get("Rows Removed by Filter", 0)) * s["Actual Loops"]
        return rows, claimed

    without, claimed = profile(reclaim=False)
    assert claimed == queued
    assert without == {"jobs_queued_idx": 5, "jobs_pkey": 5}
    with_reclaim, claimed = profile(reclaim=True)
    assert claimed == queued
    # The 500 running rows, read through jobs_running_idx or a bitmap scan of it.
    assert (with_reclaim.pop("jobs_queued_idx"), with_reclaim.pop("jobs_pkey")) == (5, 5)
    assert sum(with_reclaim.values()) == 500, with_reclaim


def test_a_worker_looks_for_expired_leases_at_its_first_claim_then_about_once_a_second(conn, make_worker):
    first, second = enqueue(conn, "noop"), enqueue(conn, "noop")
    assert [r[0] for r in conn.execute(q("claim"), claim_params("gone", batch=2))] == [first, second]
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (first,))
    worker = make_worker(lease=30.0, retention=None)
    assert [(j.id, j.attempt) for j in worker.claim()] == [(first, 2)]           # its first claim looks

    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (second,))
    assert worker.claim() == []                 # within the second: queued jobs only
    reclaimed = wait_for(worker.claim, timeout=5, interval=0.05, message="a claim that looks for expired leases")
    assert [(j.id, j.attempt) for j in reclaimed] == [(second, 2)]
    assert [tuple(r) for r in conn.execute(
        "SELECT id, attempt, reclaims, locked_by FROM pgfence.all_jobs ORDER BY id")] == [
        (first, 2, 1, "w1"), (second, 2, 1, "w1")]


@pytest.mark.parametrize("threads, async_slots", [(4, 10), (10, 4)], ids=["loop-roomier", "threads-roomier"])
def test_a_mixed_worker_reclaims_expired_leases_of_both_sorts_of_kind_in_one_round(conn, dsn, threads, async_slots):
    """A module with def and async def handlers: its claim round sends one
    claim per slot kind, and both look for expired leases.  In 0.2 the first
    claim of the round (the roomier side's kinds) spent the reclaim scan, so
    a frozen peer's expired def jobs stayed running while the loop had more
    room than the threads."""
    from pgfence.asyncjob import AsyncJob
    from pgfence.settings import Settings

    @handler("t_mixed_def")
    def sync_kind(job) -> None:
        pass

    @handler("t_mixed_async")
    async def async_kind(job: AsyncJob) -> None:
        pass

    sync_job, async_job = enqueue(conn, "t_mixed_def"), enqueue(conn, "t_mixed_async")
    assert sorted(r[0] for r in conn.execute(q("claim"), claim_params("frozen", batch=2))) == [sync_job, async_job]
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second'")
    worker = Worker(dsn, Settings(renew=False, threads=threads, async_concurrency=async_slots, retention=None),
                    name="mixed")
    try:
        first = worker.claim_round()
        second = worker.claim_round()
    finally:
        worker.close()
    # Both reclaimed within two rounds (one claim brings jobs per round), with
    # no wait for the next scan: the claim that was not sent owes its scan.
    assert sorted((j.id, j.attempt) for j in first + second) == [(sync_job, 2), (async_job, 2)]
    assert [tuple(r) for r in conn.execute(
        "SELECT id, status, attempt, reclaims, locked_by FROM pgfence.jobs ORDER BY id")] == [
        (sync_job, "running", 2, 1, "mixed"), (async_job, "running", 2, 1, "mixed")]


def test_a_mixed_worker_claims_a_job_enqueued_between_the_two_claims_of_an_empty_round_at_once(conn, dsn):
    """A mixed worker's round claims for the loop, then for the threads.  An
    async job enqueued between the two: its NOTIFY is read before the
    threads' claim, which cannot take that kind; the loop's claim had
    already found nothing.  The round is empty and the worker idles for the
    poll interval (60 s here), yet the job is claimed by the next round:
    the loop side is not left dry by a round that read an enqueue after its
    claim (in CI the job waited the whole poll interval)."""
    from pgfence.asyncjob import AsyncJob
    from pgfence.settings import Settings

    @handler("t_race_def")
    def sync_kind(job) -> None:
        pass

    @handler("t_race_async")
    async def async_kind(job: AsyncJob) -> None:
        pass

    worker = Worker(dsn, Settings(renew=False, threads=2, async_concurrency=4, poll_interval=60, retention=None),
                    name="mixed")
    enqueued: list[int] = []
    claim = worker.claim

    def claim_then_enqueue_once(*args, **kwargs):
        jobs = claim(*args, **kwargs)
        if not enqueued:
            enqueued.append(enqueue(conn, "t_race_async"))   # committed, notified, after the loop's claim
        return jobs

    try:
        worker.open()
        assert worker.wait_for_work(0.01) is False         # LISTENing, nothing queued
        worker.claim = claim_then_enqueue_once
        assert worker.claim_plan()[0].on_loop               # the loop (4 free) claims first
        assert worker._round(False, None) is False          # loop: nothing; job enqueued; threads: not their kind
        assert len(enqueued) == 1 and worker._next_claim_at > time.monotonic() + 30   # idling now
        worker.claim = claim
        wait_for(lambda: worker._round(False, None) is False and job_row(conn, enqueued[0])["status"] == "done",
                 timeout=5, interval=0.01, message="the job enqueued mid-round claimed and done")
    finally:
        worker.close()
    row = job_row(conn, enqueued[0])
    assert (row["status"], row["attempt"], row["locked_by"]) == ("done", 1, None)


def test_a_claim_with_kinds_takes_only_those_kinds_queued_or_expired(conn):
    """A worker whose threads are full while its event loop has room claims
    only async kinds (and the other way round): the kinds filter applies to
    queued jobs and to reclaims alike; without it every kind is taken."""
    noop, sleep = enqueue(conn, "noop"), enqueue(conn, "sleep")
    rows = conn.execute(q("claim"), claim_params("k1", batch=5, kinds=["sleep"])).fetchall()
    assert [(r[0], r[2]) for r in rows] == [(sleep, "sleep")]
    assert job_row(conn, noop)["status"] == "queued"

    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (sleep,))
    rows = conn.execute(q("claim"), claim_params("k2", batch=5, kinds=["noop"])).fetchall()
    assert [(r[0], r[14]) for r in rows] == [(noop, "queued")]          # the expired sleep job is not its kind
    assert (job_row(conn, sleep)["locked_by"], job_row(conn, sleep)["attempt"]) == ("k1", 1)

    rows = conn.execute(q("claim"), claim_params("k3", batch=5, kinds=["sleep", "other"])).fetchall()
    assert [(r[0], r[5], r[14]) for r in rows] == [(sleep, 2, "running")]

    # not_kinds: every kind but those (a worker's threads, unknown kinds included).
    fail, unknown, sleep2 = enqueue(conn, "fail"), enqueue(conn, "t_nobody_knows"), enqueue(conn, "sleep")
    rows = conn.execute(q("claim"), claim_params("k4", batch=5, not_kinds=["sleep"])).fetchall()
    assert sorted(r[0] for r in rows) == [fail, unknown]
    assert job_row(conn, sleep2)["status"] == "queued"


def test_a_claim_prepared_on_an_empty_table_is_planned_anew_when_the_queue_fills(dsn, conn):
    """A worker's claim is planned for the table as it is at each call, not
    once for the table as it was when the worker started.  With the plan
    made once (plan_cache_mode force_generic_plan, or auto, which picks the
    generic plan itself after five calls on an empty table) on an empty,
    analyzed table, the claim read the whole table and sorted it, and the update
    joined every row with the batch: 4.5 s a claim of 100 once 300,000 jobs
    had come, where the planned-per-call claim takes milliseconds.  Here:
    workers of both kinds claim once on an empty table, 5,000 jobs arrive,
    and each claim after that is a custom plan (no generic plan is ever
    used) that takes the jobs in claim order."""
    from pgfence.settings import Settings
    from pgfence.worker.engine import ConcurrentWorker

    conn.execute("VACUUM ANALYZE pgfence.jobs")
    many = ConcurrentWorker(dsn, Settings(renew=False, threads=4), name="many")
    one = Worker(dsn, Settings(renew=False), name="one")

    def claim_plans(worker: Worker) -> list[tuple[int, int]]:
        return worker.conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                   " WHERE statement LIKE 'WITH candidates%'").fetchall()

    try:
        for _ in range(6):      # past PostgreSQL's five custom plans before it weighs a generic one
            assert many.claim(4) == [] and one.claim(1) == []
        conn.execute("INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, 5000)")
        first = conn.execute("SELECT id FROM pgfence.jobs ORDER BY id LIMIT 5").fetchall()
        claimed = [j.id for j in many.claim(4)] + [j.id for j in one.claim(1)]
        assert claimed == [r[0] for r in first]
        assert claim_plans(many) == [(0, 7)]
        assert claim_plans(one) == [(0, 7)]
        assert many.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_custom_plan"
        assert one.conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_custom_plan"
    finally:
        for w in (many, one):
            w.close()


def test_text_array_literals_come_back_as_the_texts_they_were(conn):
    """The claim's queues and kinds go as one text each: any text, quotes,
    backslashes, commas, braces, spaces, the word NULL and the empty text
    included, is read back by PostgreSQL as itself, in order."""
    from pgfence.store.db import text_array_literal

    texts = ["default", 'say "hi"', "back\\slash", "a,b", "{x}", " padded ", "NULL", "", "é €", "\\\"\\"]
    assert text_array_literal([]) == "{}"
    assert text_array_literal(["a b"]) == '{"a b"}'
    assert conn.execute("SELECT %s::text[]", (text_array_literal(texts),)).fetchone()[0] == texts
    assert conn.execute("SELECT %s::text[]", (text_array_literal([]),)).fetchone()[0] == []
