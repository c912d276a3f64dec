"""Retention deletes only old finished rows, in batches; and finished rows
cost the claim nothing (the partial indexes jobs_queued_idx and jobs_running_idx)."""

from __future__ import annotations

import psycopg

from pgtools import pgfence, scalar
from pgfence.worker import retention
from pgfence.store.queries import q


def add_job(conn: psycopg.Connection, status: str, *, finished_ago: str | None = None,
            created_ago: str = "3 hours", lease_until_ago: str | None = None) -> int:
    """Insert one job row as it looks in that status, with chosen ages."""
    return scalar(conn, """
        INSERT INTO pgfence.jobs (kind, status, attempt, created_at, run_at, started_at, finished_at,
                                  lease_until, locked_by)
        VALUES ('noop', %(status)s, CASE WHEN %(status)s = 'queued' THEN 0 ELSE 1 END,
                now() - %(created)s::interval, now() - %(created)s::interval,
                CASE WHEN %(status)s = 'queued' THEN NULL ELSE now() - %(created)s::interval END,
                now() - %(finished)s::interval,
                CASE WHEN %(status)s = 'running' THEN now() - coalesce(%(lease)s, '0')::interval END,
                CASE WHEN %(status)s = 'running' THEN 'w-old' END)
        RETURNING id""", {"status": status, "created": created_ago, "finished": finished_ago,
                          "lease": lease_until_ago})


def ids(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs ORDER BY id")]


def test_cli_prune_deletes_only_finished_rows_older_than_the_retention(dsn, conn):
    old = [add_job(conn, s, finished_ago="2 hours") for s in ("done", "failed", "cancelled")]
    recent = [add_job(conn, s, finished_ago="30 minutes") for s in ("done", "failed", "cancelled")]
    live = [
        add_job(conn, "queued"),                                  # created 3 hours ago
        add_job(conn, "running", lease_until_ago="2 hours"),      # lease long expired
        add_job(conn, "running", lease_until_ago="-1 hour"),      # lease still held
        # Only the status decides what is finished, never a stray timestamp.
        add_job(conn, "queued", finished_ago="5 hours"),
    ]

    assert ids(conn) == sorted(old + recent + live)

    out = pgfence("prune", "--retention", "1h", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "deleted 3 finished job(s)\n", "")
    assert ids(conn) == sorted(recent + live)

    out = pgfence("prune", "--retention", "1s", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "deleted 3 finished job(s)\n", "")
    assert ids(conn) == sorted(live)

    out = pgfence("prune", "--retention", "1s", dsn=dsn)
    assert (out.returncode, out.stdout) == (0, "deleted 0 finished job(s)\n")
    assert ids(conn) == sorted(live)


def test_prune_works_in_batches_oldest_first(conn, monkeypatch):
    old = [add_job(conn, "done", finished_ago=f"{120 - i} minutes") for i in range(10)]   # oldest first
    keep = [add_job(conn, "failed", finished_ago="10 minutes"), add_job(conn, "queued")]

    assert retention.prune_once(conn, 3600, batch=3) == 3
    assert ids(conn) == sorted(old[3:] + keep)          # the three oldest went first

    batches: list[int] = []
    real = retention.prune_once

    def counting(*args, **kwargs):
        deleted = real(*args, **kwargs)
        batches.append(deleted)
        return deleted

    monkeypatch.setattr(retention, "prune_once", counting)
    assert retention.prune(conn, 3600, batch=3, max_batches=1) == 3     # bounded by max_batches
    assert batches == [3]
    assert retention.prune(conn, 3600, batch=2) == 4
    assert batches == [3, 2, 2, 0]                        # a short batch ends the run
    assert ids(conn) == sorted(keep)
    assert retention.prune(conn, 3600, batch=2) == 0
    assert batches == [3, 2, 2, 0, 0]


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
    conn.execute("SET enable_seqscan = off")    # the baseline: the same plan shape on a tiny table
    conn.execute("ANALYZE pgfence.jobs")
    baseline = claim_profile(conn)
    conn.execute("RESET enable_seqscan")

    conn.execute("""
        INSERT INTO pgfence.jobs (kind, status, attempt, created_at, run_at, started_at, finished_at)
        SELECT 'noop', (ARRAY['done', 'failed', 'cancelled'])[1 + g % 3], 1,
               now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
               now() - interval '1 day' + g * interval '1 ms'
          FROM generate_series(1, 200000) g""")
    conn.execute("ANALYZE pgfence.jobs")
    pages = scalar(conn, "SELECT pg_relation_size('pgfence.jobs') / current_setting('block_size')::int")
    assert pages > 1000
    loaded = claim_profile(conn)

    for profile in (baseline, loaded):
        assert profile["claimed"] == 5
        assert profile["seq_scans"] == []
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
