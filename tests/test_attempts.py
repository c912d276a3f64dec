"""Attempt history (pgfence.job_attempts, migration 0012): one row per
attempt that did not simply succeed, written with the event that ended it;
nothing on the happy path; the worker of every finished job kept in
history; attempt rows follow the history's retention."""

from __future__ import annotations

import os
import signal
import time

import psycopg

from metricstools import holder_pid
from pgtools import scalar, wait_for
from pgfence import client
from pgfence import Job, enqueue, handler
from pgfence.worker import retention


def attempts(conn: psycopg.Connection, job_id: int) -> list[tuple]:
    """(attempt, outcome, worker, detail) of a job's attempt rows."""
    return conn.execute("""SELECT attempt, outcome, worker, detail FROM pgfence.job_attempts
                            WHERE job_id = %s ORDER BY attempt, outcome""", (job_id,)).fetchall()


def status(conn: psycopg.Connection, job_id: int) -> str | None:
    return scalar(conn, "SELECT max(status) FROM pgfence.all_jobs WHERE id = %s", (job_id,))


def test_a_job_that_errors_twice_then_succeeds_has_two_error_rows_and_its_worker_in_history(conn, make_worker):
    @handler("flaky-twice")
    def flaky(job: Job) -> None:
        if job.attempt <= 2:
            raise RuntimeError(f"boom {job.attempt}")

    job_id = enqueue(conn, "flaky-twice", max_attempts=5)
    happy = enqueue(conn, "noop")
    worker = make_worker("w-flaky", backoff_base=0.01, backoff_max=0.02)
    wait_for(lambda: worker.run_once() is not None and status(conn, job_id) == "done", timeout=20,
             message="the job to succeed on its third attempt")

    assert attempts(conn, job_id) == [(1, "error", "w-flaky", "RuntimeError: boom 1"),
                                      (2, "error", "w-flaky", "RuntimeError: boom 2")]
    # Each error row spans its attempt: started at its claim, ended at the report.
    assert conn.execute("""SELECT bool_and(started_at IS NOT NULL AND ended_at >= started_at)
                             FROM pgfence.job_attempts WHERE job_id = %s""", (job_id,)).fetchone() == (True,)
    assert conn.execute("SELECT status, attempt, worker FROM pgfence.job_history WHERE id = %s",
                        (job_id,)).fetchall() == [("done", 3, "w-flaky")]
    # The happy path writes no attempt row; the view shows the worker too.
    assert status(conn, happy) == "done"
    assert attempts(conn, happy) == []
    assert conn.execute("SELECT worker FROM pgfence.all_jobs WHERE id IN (%s, %s) ORDER BY id",
                        (job_id, happy)).fetchall() == [("w-flaky",), ("w-flaky",)]
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_attempts") == 2


def test_a_final_error_is_recorded_and_history_keeps_the_worker(conn, make_worker):
    job_id = enqueue(conn, "fail", {"message": "no luck"}, max_attempts=1)
    assert make_worker("w-fail").run_once() == 1
    assert attempts(conn, job_id) == [(1, "error", "w-fail", "RuntimeError: no luck")]
    assert conn.execute("SELECT status, worker, last_error FROM pgfence.job_history WHERE id = %s",
                        (job_id,)).fetchall() == [("failed", "w-fail", "RuntimeError: no luck")]


def test_a_reclaim_records_the_lost_attempt_and_a_verdict_keeps_the_old_worker(conn, make_worker):
    again = enqueue(conn, "noop")
    last = enqueue(conn, "noop", max_attempts=1)
    old = make_worker("w-old", lease=0.3)
    assert sorted(j.id for j in old.claim(2)) == [again, last]
    started = dict(conn.execute("SELECT id, started_at FROM pgfence.jobs").fetchall())
    wait_for(lambda: scalar(conn, "SELECT bool_and(lease_until < now()) FROM pgfence.jobs"), timeout=10,
             message="both leases to run out")
    leases = dict(conn.execute("SELECT id, lease_until FROM pgfence.jobs").fetchall())

    [reclaimed] = make_worker("w-new").claim(2)   # the other one fails at claim: no attempts left
    assert (reclaimed.id, reclaimed.attempt) == (again, 2)
    detail = "lease expired: its worker stopped renewing it, and the job was claimed again"
    assert attempts(conn, again) == [(1, "lease_lost", "w-old", detail)]
    assert attempts(conn, last) == [(1, "lease_lost", "w-old", detail)]
    # The lost attempt ran from its claim until its lease ran out.
    assert conn.execute("SELECT job_id, started_at, ended_at FROM pgfence.job_attempts ORDER BY job_id").fetchall() \
        == [(again, started[again], leases[again]), (last, started[last], leases[last])]
    assert conn.execute("SELECT status, attempt, worker FROM pgfence.job_history WHERE id = %s",
                        (last,)).fetchall() == [("failed", 1, "w-old")]
    # A claim with nothing to reclaim writes nothing more.
    enqueue(conn, "noop")
    assert len(make_worker("w-third").claim(5)) == 1
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_attempts") == 2


def test_a_cancel_while_running_and_the_refused_completion_are_both_recorded(conn, dsn, make_worker):
    @handler("cancelled-under-me")
    def cancelled_under_me(job: Job) -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            assert client.cancel(other, [job.id]) == [job.id]
        if isinstance(job.payload, dict) and job.payload.get("fenced"):
            with job.fenced() as c:        # refused: the transaction is rolled back
                c.execute("SELECT 1")

    deferred = enqueue(conn, "cancelled-under-me", {"fenced": False})
    fenced = enqueue(conn, "cancelled-under-me", {"fenced": True})
    worker = make_worker("w-cancel", renew=False)
    assert worker.run_once() == 1
    assert worker.run_once() == 1
    assert worker.stats.outcomes == {"lost": 2}
    for job_id in (deferred, fenced):
        assert attempts(conn, job_id) == [
            (1, "cancelled", "w-cancel", "cancelled by an operator while running"),
            (1, "fence_rejected", "w-cancel", "completion refused by the fence: the job was cancelled meanwhile")]
        assert conn.execute("SELECT status, worker FROM pgfence.job_history WHERE id = %s",
                            (job_id,)).fetchall() == [("cancelled", "w-cancel")]
    # A queued job cancelled had no attempt: no row.
    queued = enqueue(conn, "noop")
    assert client.cancel(conn, [queued]) == [queued]
    assert attempts(conn, queued) == []


def test_a_timeout_is_recorded_as_such(conn, make_worker):
    @handler("too-slow", timeout=0.3)
    def too_slow(job: Job) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            job.check()              # raises LeaseLost("timeout") once the heartbeat marks it
            time.sleep(0.02)

    job_id = enqueue(conn, "too-slow", max_attempts=3)
    worker = make_worker("w-slow")
    assert worker._own is not None
    worker._own.start()              # run() starts it; run_once() alone does not
    assert worker.run_once() == 1
    assert attempts(conn, job_id) == [(1, "timeout", "w-slow", "timed out after 0.3s")]
    assert status(conn, job_id) == "queued"


def test_a_shutdown_release_is_recorded(conn, make_worker):
    worker = make_worker("w-stop", batch=3)

    @handler("stopper")
    def stop_after_this(job: Job) -> None:
        worker.request_stop()

    jobs = [enqueue(conn, "stopper") for _ in range(3)]

    assert worker.run_once() == 3
    assert status(conn, jobs[0]) == "done"
    for job_id in jobs[1:]:
        assert status(conn, job_id) == "queued"
        assert attempts(conn, job_id) == [(1, "released", "w-stop", "released at shutdown before it started")]
    assert attempts(conn, jobs[0]) == []


def test_a_dead_worker_release_is_recorded(conn, dsn, runs):
    # A short drain at the end: the released job runs again, for 30 s.
    run = runs(dsn, "--workers", "1", "--graceful-timeout", "0.5")
    job_id = enqueue(conn, "sleep", {"seconds": 30})
    wait_for(lambda: status(conn, job_id) == "running", timeout=20, message="the job to run")
    worker = scalar(conn, "SELECT locked_by FROM pgfence.jobs WHERE id = %s", (job_id,))
    os.kill(holder_pid(conn, job_id), signal.SIGKILL)
    wait_for(lambda: attempts(conn, job_id), timeout=20, message="the release of the dead worker's job")
    assert attempts(conn, job_id) == [(1, "released", worker, "worker died")]
    run.stop()


def test_attempt_rows_follow_the_history_retention(conn):
    conn.execute("""INSERT INTO pgfence.job_attempts (job_id, attempt, outcome, ended_at)
                    SELECT g, 1, 'error', now() - interval '8 days' - g * interval '1 second'
                      FROM generate_series(1, 25) g""")
    conn.execute("""INSERT INTO pgfence.job_attempts (job_id, attempt, outcome, ended_at)
                    SELECT g, 1, 'error', now() - interval '6 days' FROM generate_series(101, 103) g""")
    assert retention.prune_attempts(conn, 7 * 86400, batch=10) == 25
    done = retention.maintain(conn, 7 * 86400)
    assert done.attempts == 0
    assert [r[0] for r in conn.execute("SELECT job_id FROM pgfence.job_attempts ORDER BY job_id")] == \
        [101, 102, 103]
    assert retention.maintain(conn, 5 * 86400).attempts == 3
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_attempts") == 0


def test_an_async_job_whose_batched_completion_is_refused_is_recorded(conn, dsn):
    from pgfence import registry
    from pgfence.asyncjob import AsyncJob
    from pgfence.settings import Settings
    from pgfence.worker.engine import make_worker

    registry._REGISTRY.clear()   # async handlers alone (restored after the test)

    @handler("async-cancelled-under-me")
    async def cancelled_under_me(job: AsyncJob) -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            assert client.cancel(other, [job.id]) == [job.id]

    job_id = enqueue(conn, "async-cancelled-under-me")
    worker = make_worker(dsn, Settings(renew=False), name="w-async")
    assert worker.loop_slots is not None
    stats = worker.run(burst=True)
    assert stats.outcomes == {"lost": 1}
    assert attempts(conn, job_id) == [
        (1, "cancelled", "w-async", "cancelled by an operator while running"),
        (1, "fence_rejected", "w-async", "completion refused by the fence: the job was cancelled meanwhile")]
