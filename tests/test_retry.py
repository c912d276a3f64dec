"""Retries with backoff, terminal failures, quarantine after reclaims, and
the fence on error reports."""

from __future__ import annotations

import datetime as dt
import time

import psycopg
import pytest
from prometheus_client import REGISTRY

import pgfence.handlers.builtin  # noqa: F401 - registers noop, sleep, fail before the registry snapshot
from pgtools import job_row, scalar, wait_for
from pgfence import LeaseLost, enqueue, handler
from pgfence.worker.outcomes import DONE, FAILED, LOST, PUT_BACK, RETRIED


def clock(conn: psycopg.Connection) -> dt.datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def wait_lease_expired(conn: psycopg.Connection, job_id: int) -> None:
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (job_id,)),
             timeout=10, message=f"lease of job {job_id} to expire")


def test_failing_job_retries_with_backoff_then_fails_keeping_last_error(conn, make_worker):
    job_id = enqueue(conn, "fail", {"message": "smtp down"}, max_attempts=3)
    worker = make_worker("w-retry", backoff_base=0.2, backoff_max=10.0)
    previous_run_at = None
    for attempt in (1, 2):
        [job] = wait_for(worker.claim, timeout=10, message=f"attempt {attempt} to be claimable")
        assert job.attempt == attempt
        row = job_row(conn, job_id)
        if previous_run_at is not None:
            assert row["started_at"] >= previous_run_at    # not claimed before the backoff ran out
        before = clock(conn)
        assert worker.run_job(job) == RETRIED
        after = clock(conn)
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["last_error"]) == ("queued", attempt, "RuntimeError: smtp down")
        assert (row["locked_by"], row["lease_until"], row["finished_at"]) == (None, None, None)
        full = 0.2 * 2 ** (attempt - 1)
        assert before + dt.timedelta(seconds=full * 0.5) <= row["run_at"] <= after + dt.timedelta(seconds=full)
        previous_run_at = row["run_at"]

    [job] = wait_for(worker.claim, timeout=10, message="the final attempt to be claimable")
    assert worker.run_job(job) == FAILED
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["max_attempts"], row["last_error"]) == \
        ("failed", 3, 3, "RuntimeError: smtp down")
    assert row["finished_at"] is not None and row["locked_by"] is None and row["lease_until"] is None
    assert row["run_at"] == previous_run_at   # a final failure does not push run_at
    assert worker.claim() == []
    assert worker.stats.outcomes == {RETRIED: 2, FAILED: 1}


def test_rejected_payload_fails_at_once_unknown_kind_is_put_back_and_worker_carries_on(conn, make_worker):
    rejected = enqueue(conn, "sleep", {"seconds": -1}, priority=3)
    unknown = scalar(conn, "SELECT pgfence.enqueue('no_such_kind', '{}', 'default', 2)")
    good = enqueue(conn, "noop", priority=1)

    worker = make_worker("w-carry")
    before = clock(conn)
    stats = worker.run(burst=True)

    row = job_row(conn, rejected)
    assert (row["status"], row["attempt"], row["max_attempts"]) == ("failed", 1, 5)
    assert row["last_error"] == "payload rejected: 'seconds' must be a number of seconds >= 0, got -1"
    # A kind this worker does not know goes back, for a worker that knows
    # it, with no attempt spent (putbacks counts the claim) and not before
    # unknown_kind_delay (30 s by default).
    row = job_row(conn, unknown)
    assert (row["status"], row["attempt"], row["putbacks"], row["last_error"]) == ("queued", 1, 1, None)
    assert (row["locked_by"], row["lease_until"], row["finished_at"]) == (None, None, None)
    assert row["run_at"] >= before + dt.timedelta(seconds=30)
    assert (job_row(conn, good)["status"], job_row(conn, good)["attempt"]) == ("done", 1)
    assert stats.outcomes == {FAILED: 1, PUT_BACK: 1, DONE: 1}


def test_quarantine_after_too_many_reclaims_despite_attempts_left(conn, make_worker):
    job_id = enqueue(conn, "noop", max_attempts=10, max_reclaims=1)
    worker = make_worker("w-q", lease=0.2)
    [first] = worker.claim()
    wait_lease_expired(conn, job_id)
    [second] = worker.claim()
    assert (first.attempt, second.attempt, job_row(conn, job_id)["reclaims"]) == (1, 2, 1)

    wait_lease_expired(conn, job_id)
    assert worker.claim() == []      # the reclaim past the budget is not run
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["max_attempts"]) == ("failed", 2, 2, 10)
    assert row["last_error"] == "quarantined: lost its worker 2 times (max_reclaims 1)"
    assert (row["locked_by"], row["lease_until"]) == (None, None) and row["finished_at"] is not None
    assert (worker.stats.reclaimed, worker.stats.outcomes) == (2, {FAILED: 1})


def test_errors_do_not_spend_the_reclaim_budget(conn, make_worker):
    job_id = enqueue(conn, "fail", {"message": "nope"}, max_attempts=3, max_reclaims=0)
    worker = make_worker("w-err", backoff_base=0.05)
    outcomes = []
    for _ in range(3):
        [job] = wait_for(worker.claim, timeout=10, message="the next attempt")
        outcomes.append(worker.run_job(job))
    assert outcomes == [RETRIED, RETRIED, FAILED]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["last_error"]) == \
        ("failed", 3, 0, "RuntimeError: nope")


def test_a_single_reclaim_quarantines_with_max_reclaims_zero(conn, make_worker):
    job_id = enqueue(conn, "noop", max_attempts=5, max_reclaims=0)
    worker = make_worker("w-z", lease=0.2)
    [job] = worker.claim()
    wait_lease_expired(conn, job_id)
    assert worker.claim() == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"]) == ("failed", 1, 1)
    assert row["last_error"] == "quarantined: lost its worker 1 times (max_reclaims 0)"


def test_reclaim_of_expired_final_attempt_fails_the_job(conn, make_worker):
    job_id = enqueue(conn, "noop", max_attempts=2, max_reclaims=5)
    worker = make_worker("w-final", lease=0.2)
    [one] = worker.claim()
    wait_lease_expired(conn, job_id)
    [two] = worker.claim()
    assert (one.attempt, two.attempt) == (1, 2)
    wait_lease_expired(conn, job_id)
    assert worker.claim() == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"]) == ("failed", 2, 2)
    assert row["last_error"] == "lease expired on the final attempt (2 of 2)"
    # The late owner of the final attempt cannot complete it any more.
    with pytest.raises(LeaseLost) as lost:
        with two.fenced():
            pass
    assert lost.value.reason == "fence_rejected"
    assert job_row(conn, job_id)["status"] == "failed"


def test_stale_error_report_is_fenced_and_counted(conn, make_worker):
    @handler("t_late_fail")
    def late_fail(job):
        raise RuntimeError("late failure")

    job_id = enqueue(conn, "t_late_fail", queue="stale")
    labels = {"queue": "stale", "kind": "t_late_fail"}
    stale_worker = make_worker("w-stale", lease=0.2, queues=("stale",))
    new_owner = make_worker("w-new", queues=("stale",))
    [stale] = stale_worker.claim()
    [current] = wait_for(new_owner.claim, timeout=10, message="the reclaim")
    assert (stale.attempt, current.attempt) == (1, 2)
    row_before = job_row(conn, job_id)
    prevented_before = REGISTRY.get_sample_value("pgfence_double_run_prevented_total", labels) or 0.0

    # The stale worker has not learned yet that its lease ran out (a
    # process resumed after a pause, its heartbeat's news still to come):
    # the handler runs, and its error report meets the fence.
    stale.lease.extend(time.monotonic() + 30)
    assert stale_worker.run_job(stale) == LOST
    assert REGISTRY.get_sample_value("pgfence_double_run_prevented_total", labels) == prevented_before + 1
    assert job_row(conn, job_id) == row_before      # nothing of the stale report was written
    assert (row_before["status"], row_before["attempt"], row_before["locked_by"], row_before["last_error"]) == \
        ("running", 2, "w-new", None)
    assert stale.lease.lost_reason == "fence_rejected"

    # The current owner's report goes through.
    assert new_owner.run_job(current) == RETRIED
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["last_error"]) == ("queued", 2, "RuntimeError: late failure")
