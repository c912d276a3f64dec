"""Finished rows cost the claim nothing: they live in pgfence.job_history,
and the claim reads pgfence.jobs through the partial indexes jobs_queued_idx
and jobs_running_idx.  (Retention itself: tests/test_history_retention.py.)"""

from __future__ import annotations

import psycopg

from pgtools import scalar
from pgfence.store.queries import q


# -- claim cost ------------------------------------------------------------------


def explain_claim(conn: psycopg.Connection, batch: int = 5) -> dict:
    params = {"queues": ["default"], "batch": batch, "worker": "explain", "lease": 30.0,
              "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}
    with conn.transaction(force_rollback=True):        # EXPLAIN ANALYZE runs the UPDATE
        return conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("claim"), params).fetchone()[0][0]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def blocks(node: dict) -> int:
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def claim_profile(conn: psycopg.Connection) -> dict:
    root = explain_claim(conn)["Plan"]
    [candidates] = [n for n in nodes(root) if n.get("Subplan Name") == "CTE candidates"]
    scans = [n for n in nodes(candidates) if n.get("Relation Name") == "jobs"]
    return {
        "claimed": root["Actual Rows"],
        "seq_scans": [n["Node Type"] for n in nodes(root)
                      if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"],
        "history": sorted({n["Relation Name"] for n in nodes(root)
                           if n.get("Relation Name", "").startswith("job_history")}),
        "indexes": sorted({n.get("Index Name") for n in nodes(candidates) if n.get("Index Name")}),
        "rows_scanned": sum(n["Actual Rows"] * n["Actual Loops"] for n in scans),
        "removed": sum(n.get("Rows Removed by Filter", 0) for n in nodes(candidates)),
        "candidate_blocks": blocks(candidates),
        "total_blocks": blocks(root),
    }


def test_claim_reads_only_live_rows_through_the_partial_index(conn):
    # The live rows: 7 due and 2 not yet due.
    for priority in (0, 5, 1, 10, 3, 5, 0):
        conn.execute("SELECT pgfence.enqueue('noop', '{}', 'default', %s)", (priority,))
    for _ in range(2):
        conn.execute("SELECT pgfence.enqueue('noop', '{}', 'default', 9, now() + interval '1 hour')")
    # The same plan shape on a tiny table as on a large one: the hot table
    # holds these 9 rows alone, with or without history behind it.
    conn.execute("SET enable_seqscan = off")
    conn.execute("ANALYZE pgfence.jobs")
    baseline = claim_profile(conn)

    conn.execute("""
        INSERT INTO pgfence.job_history (kind, status, attempt, created_at, run_at, started_at, finished_at)
        SELECT 'noop', (ARRAY['done', 'failed', 'cancelled'])[1 + g % 3], 1,
               now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
               now() - interval '1 day' + g * interval '1 ms'
          FROM generate_series(1, 200000) g""")
    conn.execute("ANALYZE pgfence.jobs, pgfence.job_history")
    pages = scalar(conn, """SELECT sum(pg_relation_size(inhrelid)) / current_setting('block_size')::int
                              FROM pg_inherits WHERE inhparent = 'pgfence.job_history'::regclass""")
    assert pages > 1000
    loaded = claim_profile(conn)

    for profile in (baseline, loaded):
        assert profile["claimed"] == 5
        assert profile["seq_scans"] == [] and profile["history"] == []
        assert profile["indexes"] == ["jobs_queued_idx", "jobs_running_idx"]
        # Only the head of the queued rows is read, in index order: the 2 not
        # yet due (priority 9, first in the index) are passed over inside the
        # index (run_at <= now() is an index condition, no heap visit), the 5
        # claimed are taken and the scan stops; the 2 due rows behind them
        # and the 200,000 finished rows are never read.
        assert (profile["rows_scanned"], profile["removed"]) == (5, 0)
        assert profile["rows_scanned"] == 5
    # 200,000 finished rows (over a thousand pages) cost the candidate scan nothing ...
    assert loaded["candidate_blocks"] <= baseline["candidate_blocks"] + 4, (baseline, loaded)
    assert loaded["candidate_blocks"] <= 20, loaded
    # ... and the whole claim (lookups and updates by primary key) stays small.
    assert loaded["total_blocks"] <= 200, loaded
