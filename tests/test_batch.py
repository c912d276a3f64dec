"""Batched claims and batched fenced completion; polling without LISTEN."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql

from pgtools import scalar, wait_for
from pgfence import enqueue, handler
from pgfence.store import db
from pgfence.store.queries import q


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_batch_of_noops_is_completed_in_one_fenced_statement(conn, make_worker):
    ids = [enqueue(conn, "noop") for _ in range(10)]
    worker = make_worker(batch=10, retention=None)
    assert worker.run_once() == 10
    assert worker.stats.outcomes == {"done": 10}
    rows = conn.execute("SELECT status, attempt, finished_at FROM pgfence.all_jobs WHERE id = ANY(%s)", (ids,)).fetchall()
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
    assert conn.execute("SELECT id, status, attempt FROM pgfence.all_jobs ORDER BY id").fetchall() == \
        [(i, "done", 1) for i in noops] + [(stolen, "running", 2)]
    assert counter("pgfence_double_run_prevented_total", queue="default", kind="taken_over") == before + 1


def test_without_listen_an_idle_worker_polls_and_never_listens(dsn, conn, make_worker):
    import threading

    worker = make_worker(listen=False, poll_interval=0.1, retention=None)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND application_name LIKE "
                                      "'pgfence worker %%' AND state = 'idle'") == 1)
        job_id = enqueue(conn, "noop")
        wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done")
        queries = conn.execute("SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                               "AND application_name LIKE "
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
    # The claim (with its fence verdicts) and the fenced completion (which
    # moves the job to history).
    assert any("FOR UPDATE SKIP LOCKED" in s for s in statements), statements
    assert any("INSERT INTO pgfence.job_history" in s for s in statements), statements

    enqueue(conn, "noop")
    unprepared = make_worker(prepare=False, retention=None)
    assert unprepared.run_once() == 1
    assert prepared(unprepared) == []
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'done'") == 2


def histogram(name: str, queue: str, kind: str) -> dict[str, float]:
    """The histogram's buckets (by upper bound), _count and _sum."""
    values = {}
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name.startswith(name) and s.labels.get("queue") == queue and s.labels.get("kind") == kind:
                key = s.labels["le"] if s.name.endswith("_bucket") else s.name[len(name):]
                values[key] = s.value
    return values


def test_observe_many_equals_one_observe_per_value():
    from prometheus_client import CollectorRegistry, Histogram

    from pgfence.observe import metrics

    registry = CollectorRegistry()
    one = Histogram("one_by_one", "", ["k"], registry=registry)
    many = Histogram("all_at_once", "", ["k"], registry=registry)
    # Values on bucket bounds, between them, above the last and zero.
    values = [0.0, 0.005, 0.0051, 0.01, 0.3, 0.3, 2.5, 7.0, 9.99, 10.0, 11.0, 1e6]
    for value in values:
        one.labels("x").observe(value)
    metrics.observe_many(many.labels("x"), values)
    metrics.observe_many(many.labels("x"), [])

    def samples(name):
        return sorted((s.name.removeprefix(name), s.labels.get("le"), s.value)
                      for m in registry.collect() for s in m.samples
                      if s.name.startswith(name) and not s.name.endswith("_created"))

    assert samples("one_by_one") == samples("all_at_once")
    assert ("_count", None, 12.0) in samples("all_at_once")


def test_a_batch_observes_every_jobs_wait_and_run_time_and_decodes_payloads_on_demand(conn, make_worker):
    seen = []

    @handler("reads_payload")
    def reads_payload(job):
        seen.append((job.id, job.payload))

    kind_times = {"noop": histogram("pgfence_job_duration_seconds", "default", "noop"),
                  "reads_payload": histogram("pgfence_job_duration_seconds", "default", "reads_payload")}
    waits = histogram("pgfence_job_wait_seconds", "default", "noop")
    noops = [enqueue(conn, "noop", {"n": i}) for i in range(7)]
    reader = enqueue(conn, "reads_payload", {"order": {"id": 7, "lines": [1, 2]}, "note": "é"})
    worker = make_worker(batch=8, retention=None)
    assert worker.run_once() == 8
    assert worker.stats.outcomes == {"done": 8}
    assert seen == [(reader, {"order": {"id": 7, "lines": [1, 2]}, "note": "é"})]

    after = histogram("pgfence_job_duration_seconds", "default", "noop")
    assert after["_count"] == kind_times["noop"].get("_count", 0) + 7
    assert after["+Inf"] == kind_times["noop"].get("+Inf", 0) + 7
    # No-op handlers run in far less than a second.
    assert after["1.0"] == kind_times["noop"].get("1.0", 0) + 7
    assert histogram("pgfence_job_duration_seconds", "default", "reads_payload")["_count"] == \
        kind_times["reads_payload"].get("_count", 0) + 1
    assert histogram("pgfence_job_wait_seconds", "default", "noop")["_count"] == waits.get("_count", 0) + 7
    assert sorted(r[0] for r in conn.execute("SELECT id FROM pgfence.all_jobs WHERE status = 'done'")) == \
        sorted(noops + [reader])


def _join_filtered(plan: dict) -> int:
    """Rows every join node of a JSON plan read and threw away, in all."""
    removed = plan.get("Rows Removed by Join Filter", 0) * plan.get("Actual Loops", 1)
    return removed + sum(_join_filtered(child) for child in plan.get("Plans", []))


@pytest.mark.parametrize("name", ["complete_many", "renew"])
def test_many_locked_jobs_are_updated_through_the_primary_key_with_stale_statistics(conn, name):
    """Right after a bulk enqueue the statistics say no job is running.  A
    worker's session plans its statements generically, once: the batched
    completion and the heartbeat's renewal of 300 jobs must still update
    each locked row through the primary key, not scan the running jobs once
    per row (which read 300 x 300 rows and threw all but 300 away)."""
    conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, 5000)")
    conn.execute("ANALYZE pgfence.jobs")          # every row queued, as far as the planner knows
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": 300, "worker": "stale", "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": False, "kinds": None,
                                     "not_kinds": None}).fetchall()
    args = [db.array_literal(r[0] for r in rows), db.array_literal(r[5] for r in rows),
            db.array_literal(30.0 for _ in rows)][:3 if name == "renew" else 2]
    text = q(name).replace("%(ids)s", "$1").replace("%(attempts)s", "$2").replace("%(leases)s", "$3") \
        .replace("%(results)s", "NULL")
    with conn.transaction(force_rollback=True):       # EXPLAIN ANALYZE runs the UPDATE
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(sql.SQL("PREPARE stale_many AS {}").format(sql.SQL(text)))
        plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE stale_many({})").format(
            sql.SQL(", ").join(sql.Literal(a) for a in args))).fetchone()[0][0]["Plan"]
        conn.execute("DEALLOCATE stale_many")
    assert plan["Actual Rows"] == 300
    assert _join_filtered(plan) == 0, plan
