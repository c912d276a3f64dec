"""Jobs of a kind a worker does not know (issue 9, point 5): put back,
fenced, with no attempt spent, until a worker that knows the kind runs them
(a rolling deploy), or failed once older than unknown_kind_timeout."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import REGISTRY

import pgfence.handlers.builtin  # noqa: F401 - registers noop, sleep, fail before the registry snapshot
from metricstools import total
from pgtools import job_row, pgfence, scalar, spawn, wait_for
from pgfence import enqueue
from pgfence.worker.outcomes import DONE, FAILED, LOST, PUT_BACK


def rows(conn, kind: str) -> list[tuple]:
    return conn.execute("SELECT id, status, attempt, putbacks, max_attempts, last_error FROM pgfence.all_jobs"
                        " WHERE kind = %s ORDER BY id", (kind,)).fetchall()


def test_rolling_deploy_old_worker_puts_back_new_worker_runs_every_job(dsn, conn, runs):
    # The old release: a `pgfence run` whose handler modules lack new_kind.
    old = runs(dsn, "--workers", "1", "--poll-interval", "0.5", "--unknown-kind-delay", "0.2")
    # The producer ships new_kind first, with a budget of 2 attempts: had
    # the put-backs spent attempts, every job would fail before the new
    # release is up.
    ids = [scalar(conn, "SELECT pgfence.enqueue('new_kind', '{}', p_max_attempts => 2)") for _ in range(6)]
    known = scalar(conn, "SELECT pgfence.enqueue('noop')")
    wait_for(lambda: scalar(conn, "SELECT min(putbacks) FROM pgfence.all_jobs WHERE kind = 'new_kind'") >= 3,
             timeout=20, message="the old worker to put every new_kind job back three times")
    assert job_row(conn, known)["status"] == "done"     # the old worker works on
    assert {status for _id, status, *_ in rows(conn, "new_kind")} <= {"queued", "running"}

    # The new release comes up next to the old one.
    new = spawn("work", "--name", "new", "--handlers", "pgfence.handlers.builtin,rollout_handlers",
                "--poll-interval", "0.5", dsn=dsn, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: all(r[1] == "done" for r in rows(conn, "new_kind")), timeout=20,
                 message="every new_kind job done")
        final = rows(conn, "new_kind")
        # One attempt spent each: the run by the new worker.  Every other
        # claim was a put-back, and attempt (the fencing token) counts them all.
        assert [(i, status, attempt - putbacks, max_attempts, error)
                for i, status, attempt, putbacks, max_attempts, error in final] == \
            [(i, "done", 1, 2, None) for i in ids]
        assert all(putbacks >= 3 for _i, _s, _a, putbacks, _m, _e in final)
        assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'failed'") == 0
        assert scalar(conn, "SELECT array_agg(DISTINCT locked_by) FROM pgfence.all_jobs") == [None]
        # Every put-back was the old worker's and is counted, by queue and kind.
        putbacks = sum(r[3] for r in final)
        assert total(old.scrape(), "pgfence_unknown_kind_total", queue="default", kind="new_kind") == putbacks
    finally:
        new.terminate()
        _out, new_err = new.communicate(timeout=30)
    assert new.returncode == 0, new_err
    assert "does not know" not in new_err
    err = old.stop()
    # Logged once per kind by the worker process, however many put-backs.
    lines = [line for line in err.splitlines() if "does not know job kind" in line]
    assert len(lines) == 1, err
    assert "WARNING pgfence.worker: worker " in lines[0]
    assert lines[0].endswith("does not know job kind new_kind (queue default): putting its jobs back for 0.2s "
                             "each, for a worker that knows it, until they are 3600s old (logged once per kind)")


def test_unknown_kind_past_the_timeout_fails_naming_the_kind(conn, make_worker):
    young = scalar(conn, "SELECT pgfence.enqueue('gone_kind', '{}', 'default', 1)")
    old = scalar(conn, "SELECT pgfence.enqueue('gone_kind', '{}', 'default', 2)")
    conn.execute("UPDATE pgfence.jobs SET created_at = now() - interval '2 hours' WHERE id = %s", (old,))
    worker = make_worker("w-old", unknown_kind_delay=60.0, unknown_kind_timeout=3600.0)
    labels = {"queue": "default", "kind": "gone_kind"}
    failed_before = REGISTRY.get_sample_value("pgfence_jobs_failed_total", labels) or 0.0
    unknown_before = REGISTRY.get_sample_value("pgfence_unknown_kind_total", labels) or 0.0

    stats = worker.run(burst=True)

    assert stats.outcomes == {FAILED: 1, PUT_BACK: 1}
    row = job_row(conn, old)
    assert (row["status"], row["attempt"], row["putbacks"], row["locked_by"], row["lease_until"]) == \
        ("failed", 1, 0, None, None)
    assert row["finished_at"] is not None
    assert row["last_error"] == ("unknown job kind 'gone_kind': no worker that claimed it knew it within 3600s "
                                 "of its creation (known here: effect, fail, noop, send_receipt, sleep)")
    assert row["last_traceback"] is None
    row = job_row(conn, young)
    assert (row["status"], row["attempt"], row["putbacks"], row["last_error"]) == ("queued", 1, 1, None)
    assert REGISTRY.get_sample_value("pgfence_jobs_failed_total", labels) == failed_before + 1
    assert REGISTRY.get_sample_value("pgfence_unknown_kind_total", labels) == unknown_before + 2


def test_put_back_inside_a_batch_lets_the_rest_of_the_batch_run(conn, make_worker):
    ids = [enqueue(conn, "noop", priority=3),
           scalar(conn, "SELECT pgfence.enqueue('later_kind', '{}', 'default', 2)"),
           enqueue(conn, "noop", priority=1)]
    worker = make_worker("w-batch", batch=3, unknown_kind_delay=60.0)
    assert worker.run_once() == 3
    assert [(r["status"], r["attempt"], r["putbacks"]) for r in map(lambda i: job_row(conn, i), ids)] == \
        [("done", 1, 0), ("queued", 1, 1), ("done", 1, 0)]
    assert worker.stats.outcomes == {DONE: 2, PUT_BACK: 1}
    # Put back for unknown_kind_delay: not claimable again before it.
    assert worker.claim() == []


def test_put_back_is_fenced(conn, make_worker):
    job_id = scalar(conn, "SELECT pgfence.enqueue('later_kind')")
    stale = make_worker("w-stale", lease=0.2)
    [job] = stale.claim()
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (job_id,)),
             timeout=10, message="the lease to run out")
    # Another worker reclaims it (attempt 2); the stale attempt's put-back
    # must not hand the new owner's job back.
    [current] = make_worker("w-new").claim()
    assert (current.id, current.attempt) == (job_id, 2)
    assert stale.run_job(job) == LOST
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["putbacks"], row["locked_by"]) == ("running", 2, 0, "w-new")
    assert job.lease.lost_reason == "fence_rejected"


def test_put_backs_spend_no_attempt_of_retries_and_of_pgfence_retry(dsn, conn, make_worker):
    # Two put-backs, then the kind becomes known and its first run fails:
    # with max_attempts 2 the job is retried, not failed for want of attempts.
    from pgfence import handler

    job_id = scalar(conn, "SELECT pgfence.enqueue('late_fail', '{}', p_max_attempts => 2)")
    worker = make_worker("w-late", unknown_kind_delay=0.01, backoff_base=0.01)
    for _ in range(2):
        [job] = wait_for(worker.claim, timeout=10, message="the job claimable")
        assert worker.run_job(job) == PUT_BACK
    assert (job_row(conn, job_id)["attempt"], job_row(conn, job_id)["putbacks"]) == (2, 2)

    @handler("late_fail")
    def late_fail(job):
        raise RuntimeError("still broken")

    outcomes = []
    for _ in range(2):
        [job] = wait_for(worker.claim, timeout=10, message="the job claimable")
        outcomes.append(worker.run_job(job))
    assert outcomes == ["retried", "failed"]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["putbacks"], row["max_attempts"]) == ("failed", 4, 2, 2)
    # `pgfence retry` gives one attempt more than those spent (2), not than
    # the attempt counter (4).
    out = pgfence("retry", str(job_id), dsn=dsn)
    assert (out.returncode, out.stdout) == (0, f"requeued 1 job(s): {job_id}\n")
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["putbacks"], row["max_attempts"]) == ("queued", 4, 2, 3)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_invalid_unknown_kind_settings_are_one_line(dsn, value):
    for name in ("unknown-kind-delay", "unknown-kind-timeout"):
        out = pgfence("work", "--burst", f"--{name}", value, dsn=dsn)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"pgfence: error: invalid {name}: "), out.stderr


def test_unknown_kind_settings_come_from_the_environment(dsn):
    from pgfence import settings

    s = settings.load({}, env={"PGFENCE_UNKNOWN_KIND_DELAY": "2s", "PGFENCE_UNKNOWN_KIND_TIMEOUT": "2h"})
    assert (s.unknown_kind_delay, s.unknown_kind_timeout) == (2.0, 7200.0)
    assert (settings.Settings().unknown_kind_delay, settings.Settings().unknown_kind_timeout) == (30.0, 3600.0)
