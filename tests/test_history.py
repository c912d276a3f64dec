"""A finished job leaves pgfence.jobs for pgfence.job_history in the
statement that finishes it, fenced as before; history keeps it under the
same id, and retry brings it back."""

from __future__ import annotations

import psycopg
import pytest

from pgtools import pgfence, scalar, wait_for
from pgfence import client
from pgfence import enqueue
from pgfence.backoff import Backoff
from pgfence.admin import commands as admin
from pgfence.store import jobs as store


def live(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs ORDER BY id")]


def history(conn: psycopg.Connection) -> list[tuple]:
    """Every history row: (id, status, attempt, last_error), by id."""
    return conn.execute("SELECT id, status, attempt, last_error FROM pgfence.job_history ORDER BY id").fetchall()


def test_done_failed_and_cancelled_jobs_leave_the_hot_table_for_history(conn, make_worker):
    done, failed, cancelled, running_cancelled, waiting = (enqueue(conn, "noop") for _ in range(5))
    claimed = {j.id: j for j in make_worker().claim(3)}
    assert sorted(claimed) == [done, failed, cancelled]
    assert history(conn) == []

    assert store.complete(conn, done, 1)
    assert store.fail_or_retry(conn, failed, 1, error="RuntimeError: boom", traceback="tb", final=True,
                               backoff=Backoff()).status == "failed"
    [again] = make_worker("w2").claim(1)
    assert again.id == running_cancelled
    assert client.cancel(conn, [cancelled, running_cancelled]) == [cancelled, running_cancelled]

    assert live(conn) == [waiting]
    assert history(conn) == [(done, "done", 1, None), (failed, "failed", 1, "RuntimeError: boom"),
                             (cancelled, "cancelled", 1, "cancelled by an operator"),
                             (running_cancelled, "cancelled", 1, "cancelled by an operator")]
    # No lease columns in history; the view shows them as NULL, and every job once.
    assert conn.execute("""SELECT id, status, locked_by, lease_until, finished_at IS NOT NULL
                             FROM pgfence.all_jobs ORDER BY id""").fetchall() == [
        (done, "done", None, None, True), (failed, "failed", None, None, True),
        (cancelled, "cancelled", None, None, True), (running_cancelled, "cancelled", None, None, True),
        (waiting, "queued", None, None, False)]
    assert scalar(conn, "SELECT last_traceback FROM pgfence.all_jobs WHERE id = %s", (failed,)) == "tb"

    # The cancelled job's worker finds its completion refused by the fence,
    # and nothing is written twice.
    assert not store.complete(conn, running_cancelled, 1)
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE id = %s", (running_cancelled,)) == 1


def test_a_stale_completion_after_a_reclaim_is_refused_and_history_holds_the_job_once(conn, make_worker):
    job_id = enqueue(conn, "noop")
    [first] = make_worker("w-old", lease=0.2).claim(1)
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.jobs WHERE id = %s", (job_id,)),
             timeout=10, message="the lease to run out")
    [second] = make_worker("w-new").claim(1)
    assert (first.id, first.attempt, second.id, second.attempt) == (job_id, 1, job_id, 2)

    assert store.complete(conn, job_id, 2)
    # The stale attempt, through each completion path: every one is refused.
    assert not store.complete(conn, job_id, 1)
    assert store.complete_many(conn, [job_id], [1]) == set()
    assert store.fail_or_retry(conn, job_id, 1, error="late", traceback=None, final=True,
                               backoff=Backoff()) is None
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT pgfence.complete_fenced(%s, 1)", (job_id,))
    assert refused.value.sqlstate == "PF001"
    # The winning attempt itself cannot complete twice either.
    assert not store.complete(conn, job_id, 2)
    assert history(conn) == [(job_id, "done", 2, None)]
    assert live(conn) == []


def test_a_claim_verdict_moves_the_failed_job_to_history(conn, make_worker):
    job_id = enqueue(conn, "noop", max_reclaims=0)
    make_worker("w-gone", lease=0.2).claim(1)
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.jobs WHERE id = %s", (job_id,)),
             timeout=10, message="the lease to run out")
    assert make_worker("w-next").claim(1) == []       # quarantined, not run
    assert live(conn) == []
    assert history(conn) == [(job_id, "failed", 1, "quarantined: lost its worker 1 times (max_reclaims 0)")]
    assert scalar(conn, "SELECT reclaims FROM pgfence.job_history WHERE id = %s", (job_id,)) == 1


def test_retry_moves_a_job_back_from_history_under_its_id(dsn, conn, make_worker):
    job_id = enqueue(conn, "noop", {"n": 7}, dedupe_key="k")
    [job] = make_worker().claim(1)
    store.fail_or_retry(conn, job_id, 1, error="boom", traceback=None, final=True, backoff=Backoff())
    assert live(conn) == []

    out = pgfence("retry", str(job_id), dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"requeued 1 job(s): {job_id}\n", "")
    assert history(conn) == []
    assert conn.execute("""SELECT id, status, attempt, max_attempts, payload, dedupe_key, last_error
                             FROM pgfence.jobs""").fetchall() == [(job_id, "queued", 1, 2, {"n": 7}, "k", "boom")]
    # The dedupe key is live again, and the job runs its next attempt.
    assert enqueue(conn, "noop", dedupe_key="k") == job_id
    [again] = make_worker("w2").claim(1)
    assert (again.id, again.attempt) == (job_id, 2)
    assert store.complete(conn, job_id, 2)
    assert history(conn) == [(job_id, "done", 2, "boom")]


def test_status_counts_history_exactly_when_small_and_from_a_sample_when_large():
    assert admin.history_sample_percent(0) == 100.0
    assert admin.history_sample_percent(1_000_000) == 100.0
    assert admin.history_sample_percent(4_000_000) == 25.0
    assert admin.history_sample_percent(100_000_000) == 1.0
    assert admin.history_sample_percent(1e12) == 0.001


def test_status_reports_sampled_counts_as_estimated(conn, monkeypatch):
    conn.execute("""INSERT INTO pgfence.job_history (kind, status, finished_at)
                    SELECT 'noop', 'done', now() FROM generate_series(1, 30000)""")
    conn.execute("VACUUM ANALYZE pgfence.job_history")
    exact = admin.status(conn)
    assert (exact["queues"], exact["estimated"]) == ({"default": {"done": 30000}}, False)
    # Past the bound, finished jobs are counted from a sample of the pages.
    monkeypatch.setattr(admin, "EXACT_HISTORY_ROWS", 15000)
    sampled = admin.status(conn)
    assert sampled["estimated"] is True
    assert set(sampled["queues"]) == {"default"} and set(sampled["queues"]["default"]) == {"done"}
    assert 0 < sampled["queues"]["default"]["done"] < 120000


def test_a_finished_no_op_job_costs_history_under_200_bytes(conn):
    """Measured with bench/history_footprint.py: about 150 bytes a job in
    history (heap and both indexes), against about 560 in 0008's jobs table."""
    jobs = 20000
    conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, %s)", (jobs,))
    conn.execute("""UPDATE pgfence.jobs SET status = 'running', attempt = 1, locked_by = 'host:1234:w1:0a1b2c3d',
                           lease_until = now() + interval '1 minute', started_at = now()""")
    for _ in range(jobs // 1000):
        ids = [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs ORDER BY id LIMIT 1000")]
        assert len(store.complete_many(conn, ids, [1] * len(ids))) == len(ids)
    assert live(conn) == []
    size = scalar(conn, """SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits
                            WHERE inhparent = 'pgfence.job_history'::regclass""")
    assert 100 < size / jobs < 200, size / jobs
