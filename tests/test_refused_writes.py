"""Every owner write the fence refuses is recorded, not only completions:
an error report of a job cancelled under its handler, and a put-back of an
unknown kind cancelled before it was handed back, each leave one
``fence_rejected`` row in pgfence.job_attempts (saying which write was
refused) and count once in ``pgfence_double_run_prevented_total``, in every
mode that makes the write."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import REGISTRY

from pgfence import client
from pgfence import AsyncJob, Job, enqueue, handler, registry
from pgfence.settings import Settings
from pgfence.worker.engine import make_worker
from pgfence.worker.outcomes import LOST

MODES = {
    "one-job": ({}, ("sync",)),
    "threads": ({"threads": 4}, ("sync",)),
    "async": ({"async_concurrency": 10}, ("async",)),
    "mixed": ({"threads": 4, "async_concurrency": 10}, ("sync", "async")),
}


def attempts(conn: psycopg.Connection, job_id: int) -> list[tuple]:
    return conn.execute("SELECT attempt, outcome, worker, detail FROM pgfence.job_attempts WHERE job_id = %s"
                        " ORDER BY attempt, outcome", (job_id,)).fetchall()


def prevented(kind: str) -> float:
    return REGISTRY.get_sample_value("pgfence_double_run_prevented_total", {"queue": "default", "kind": kind}) or 0.0


@pytest.mark.parametrize("mode", list(MODES))
def test_an_error_report_refused_by_the_fence_is_recorded_in_every_mode(conn, dsn, mode):
    options, sorts = MODES[mode]
    registry._REGISTRY.clear()   # only this test's handlers (restored after the test)

    def cancel_me(job_id: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            assert client.cancel(other, [job_id]) == [job_id]

    @handler("refused-report-sync")
    def sync_kind(job: Job) -> None:
        cancel_me(job.id)
        raise RuntimeError("the gateway said no")

    @handler("refused-report-async")
    async def async_kind(job: AsyncJob) -> None:
        cancel_me(job.id)
        raise RuntimeError("the gateway said no")

    if "async" not in sorts:
        del registry._REGISTRY["refused-report-async"]
    if "sync" not in sorts:
        del registry._REGISTRY["refused-report-sync"]
    kinds = [f"refused-report-{sort}" for sort in sorts]
    before = {kind: prevented(kind) for kind in kinds}
    ids = {kind: enqueue(conn, kind, max_attempts=3) for kind in kinds}
    worker = make_worker(dsn, Settings(renew=False, **options), name=f"w-{mode}")
    stats = worker.run(burst=True)
    assert stats.outcomes == {LOST: len(kinds)}
    for kind, job_id in ids.items():
        assert attempts(conn, job_id) == [
            (1, "cancelled", f"w-{mode}", "cancelled by an operator while running"),
            (1, "fence_rejected", f"w-{mode}", "error report refused by the fence: the job was cancelled meanwhile")]
        assert prevented(kind) - before[kind] == 1
        assert conn.execute("SELECT status, attempt FROM pgfence.all_jobs WHERE id = %s",
                            (job_id,)).fetchone() == ("cancelled", 1)


def test_a_put_back_refused_by_the_fence_is_recorded(conn, dsn, make_worker):
    """The slots of def handlers put back a kind nobody here knows; a job
    cancelled between its claim and its put-back is not handed back."""
    job_id = enqueue(conn, "nobody-knows-this-kind")
    worker = make_worker("w-putback")
    [job] = worker.claim()
    assert client.cancel(conn, [job_id]) == [job_id]
    before = prevented("nobody-knows-this-kind")
    assert worker.run_job(job) == LOST
    assert attempts(conn, job_id) == [
        (1, "cancelled", "w-putback", "cancelled by an operator while running"),
        (1, "fence_rejected", "w-putback", "put-back refused by the fence: the job was cancelled meanwhile")]
    assert prevented("nobody-knows-this-kind") - before == 1



def test_a_refusal_an_outage_kept_unrecorded_is_recorded_once_the_database_answers(conn, dsn, make_worker):
    """The fence refused a completion, and the database went out of reach
    before the refusal's row was written: the worker keeps it, writes it at
    its next turn once the database answers, and never twice."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    worker = make_worker("w-outage")
    job_id = enqueue(conn, "nobody-knows-this-kind")
    [job] = worker.claim()
    assert client.cancel(conn, [job_id]) == [job_id]
    # The database out of reach: the worker's connection gone, and nothing
    # listening where it would connect again.
    worker._drop_connection()
    worker.dsn = make_conninfo("", **{**params, "host": "127.0.0.1", "port": "1", "connect_timeout": "2"})
    worker.note_rejected([job])
    assert attempts(conn, job_id) == [(1, "cancelled", "w-outage", "cancelled by an operator while running")]
    worker.dsn = dsn
    worker.record_unrecorded()
    worker.record_unrecorded()
    assert attempts(conn, job_id) == [
        (1, "cancelled", "w-outage", "cancelled by an operator while running"),
        (1, "fence_rejected", "w-outage", "completion refused by the fence: the job was cancelled meanwhile")]
