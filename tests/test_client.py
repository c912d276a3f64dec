"""The client API beyond enqueue: get_job / aget_job (a job live or
finished, with its recorded attempts), cancel and retry as functions."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import pgfence.handlers.builtin  # noqa: F401 - registers noop & co. before the registry snapshot
from pgtools import wait_for
from pgfence import ConfigError, Job, JobInfo, aget_job, cancel, enqueue, get_job, handler, retry
from pgfence.client import Attempt


def test_get_job_follows_a_job_from_queued_through_two_errors_to_done_in_history(conn, make_worker):
    @handler("t_client_flaky")
    def flaky(job: Job) -> None:
        if job.attempt <= 2:
            raise RuntimeError(f"boom {job.attempt}")

    job_id = enqueue(conn, "t_client_flaky", {"order": 7}, queue="default", priority=2, dedupe_key="c-1")
    queued = get_job(conn, job_id)
    assert isinstance(queued, JobInfo)
    assert (queued.id, queued.kind, queued.queue, queued.status, queued.payload, queued.priority, queued.attempt,
            queued.max_attempts, queued.reclaims, queued.dedupe_key, queued.started_at, queued.finished_at,
            queued.worker, queued.last_error, queued.attempts, queued.finished, queued.errors) == (
        job_id, "t_client_flaky", "default", "queued", {"order": 7}, 2, 0, 5, 0, "c-1", None, None, None, None,
        (), False, [])
    assert queued.run_at == queued.created_at

    worker = make_worker("w-client", backoff_base=0.01, backoff_max=0.02)
    wait_for(lambda: worker.run_once() is not None and get_job(conn, job_id).status == "done", timeout=20,
             message="the job to succeed on its third attempt")
    done = get_job(conn, job_id)
    assert (done.status, done.attempt, done.worker, done.finished, done.errors) == (
        "done", 3, "w-client", True, ["RuntimeError: boom 1", "RuntimeError: boom 2"])
    assert [(a.attempt, a.outcome, a.worker, a.detail) for a in done.attempts] == [
        (1, "error", "w-client", "RuntimeError: boom 1"), (2, "error", "w-client", "RuntimeError: boom 2")]
    assert all(isinstance(a, Attempt) and a.started_at <= a.ended_at for a in done.attempts)
    assert done.created_at <= done.started_at <= done.finished_at
    # The job is in history now, read through the same call.
    assert conn.execute("SELECT count(*) FROM pgfence.job_history WHERE id = %s", (job_id,)).fetchone() == (1,)


def test_get_job_of_an_unknown_id_is_none_and_a_bad_id_one_clear_error(conn):
    assert get_job(conn, 987654321) is None
    for bad in (0, -3, "12", 1.5, True, None):
        with pytest.raises(ConfigError, match="invalid job id: must be a positive whole number"):
            get_job(conn, bad)  # type: ignore[arg-type]


def test_aget_job_reads_what_get_job_reads(dsn, conn):
    job_id = enqueue(conn, "fail", {"message": "no luck"}, max_attempts=1)
    missing = 987654321

    async def read():
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            found, none = await aget_job(aconn, job_id), await aget_job(aconn, missing)
            with pytest.raises(ConfigError, match="invalid job id"):
                await aget_job(aconn, 0)
            return found, none

    found, none = asyncio.run(read())
    assert none is None
    assert found == get_job(conn, job_id)
    assert (found.status, found.payload, found.max_attempts) == ("queued", {"message": "no luck"}, 1)


def test_cancel_and_retry_as_functions_in_the_callers_transaction(dsn, conn, make_worker):
    failing = enqueue(conn, "fail", {"message": "no luck"}, max_attempts=1)
    waiting = enqueue(conn, "noop", queue="elsewhere")
    assert make_worker("w-fail").run_once() == 1
    assert get_job(conn, failing).status == "failed"

    with psycopg.connect(dsn) as other:
        assert cancel(other, [waiting, failing]) == [waiting]     # a failed job is not cancelled
        assert get_job(conn, waiting).status == "queued"           # not committed yet
        other.rollback()
    assert get_job(conn, waiting).status == "queued"
    assert cancel(conn, [waiting]) == [waiting]
    cancelled = get_job(conn, waiting)
    assert (cancelled.status, [a.outcome for a in cancelled.attempts]) == ("cancelled", [])

    result = retry(conn, [failing, waiting])
    assert (sorted(result.requeued), result.skipped) == (sorted([failing, waiting]), [])
    again = get_job(conn, failing)
    assert (again.status, again.attempt, again.max_attempts) == ("queued", 1, 2)
    assert get_job(conn, waiting).status == "queued"
    for bad in ([0], ["1"]):
        with pytest.raises(ConfigError, match="invalid job id"):
            cancel(conn, bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="invalid job id"):
            retry(conn, bad)  # type: ignore[arg-type]
