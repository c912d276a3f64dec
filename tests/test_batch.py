"""Batched claims and batched fenced completion; polling without LISTEN."""

from __future__ import annotations

import psycopg
from prometheus_client import REGISTRY

from pgtools import scalar, wait_for
from supervisor import enqueue, handler


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_batch_of_noops_is_completed_in_one_fenced_statement(conn, make_worker):
    ids = [enqueue(conn, "noop") for _ in range(10)]
    worker = make_worker(batch=10, retention=None)
    assert worker.run_once() == 10
    assert worker.stats.outcomes == {"done": 10}
    rows = conn.execute("SELECT status, attempt, finished_at FROM pgfence.jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    assert {(status, attempt) for status, attempt, _ in rows} == {("done", 1)}
    # One statement, one transaction: one now() for all ten.
    assert len({finished for _, _, finished in rows}) == 1


def test_a_job_taken_over_within_the_batch_is_refused_by_the_fence(dsn, conn, make_worker):
    @handler("taken_over")
    def taken_over(job):
        # Another worker reclaims this very job while this one still holds it.
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("UPDATE pgfence.jobs SET attempt = attempt + 1 WHERE id = %s", (job.id,))

    before = counter("pgfence_double_run_prevented_total", queue="default", kind="taken_over")
    noops = [enqueue(conn, "noop") for _ in range(3)]
    stolen = enqueue(conn, "taken_over", priority=10)
    worker = make_worker(batch=4, retention=None)
    assert worker.run_once() == 4
    assert worker.stats.outcomes == {"done": 3, "lost": 1}
    assert conn.execute("SELECT id, status, attempt FROM pgfence.jobs ORDER BY id").fetchall() == \
        [(i, "done", 1) for i in noops] + [(stolen, "running", 2)]
    assert counter("pgfence_double_run_prevented_total", queue="default", kind="taken_over") == before + 1


def test_without_listen_an_idle_worker_polls_and_never_listens(dsn, conn, make_worker):
    import threading

    worker = make_worker(listen=False, poll_interval=0.1, retention=None)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                                      "'pgfence worker %%' AND state = 'idle'") == 1)
        job_id = enqueue(conn, "noop")
        wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.jobs WHERE id = %s", (job_id,)) == "done")
        queries = conn.execute("SELECT query FROM pg_stat_activity WHERE application_name LIKE "
                               "'pgfence worker %%'").fetchall()
        assert all("LISTEN" not in q for (q,) in queries)
        assert worker._listening is False
    finally:
        worker.request_stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_worker_prepares_its_statements_unless_told_not_to(conn, make_worker):
    def prepared(worker) -> list[str]:
        rows = worker.conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        return [statement for (statement,) in rows]

    enqueue(conn, "noop")
    worker = make_worker(retention=None)
    assert worker.run_once() == 1
    statements = prepared(worker)
    # The claim (with its fence verdicts) and the fenced completion.
    assert any("FOR UPDATE SKIP LOCKED" in s for s in statements), statements
    assert any("status = 'done'" in s for s in statements), statements

    enqueue(conn, "noop")
    unprepared = make_worker(prepare=False, retention=None)
    assert unprepared.run_once() == 1
    assert prepared(unprepared) == []
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE status = 'done'") == 2
