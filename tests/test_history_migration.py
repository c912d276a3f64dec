"""Migration 0009 moves an existing 0.x database's finished jobs into
history: exact counts, the partitions their days span, and a moved job
still found by id, retried and pruned."""

from __future__ import annotations

import psycopg
import pytest

from pgtools import pgfence, scalar
from pgfence.store import migrate
from pgfence.store.queries import q


def migrate_to(conn: psycopg.Connection, version: int) -> None:
    """Apply the migrations up to ``version``, as an older pgfence did."""
    with conn.transaction():
        conn.execute(q("migrations_bootstrap"))
        for m in migrate.available():
            if m.version <= version:
                conn.execute(m.sql())
                conn.execute(q("migrations_record"), {"version": m.version, "name": m.name})


def upgrade_a_database_of(empty_dsn: str, finished: int) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate_to(conn, 8)
        # Finished jobs over the last 10 days, one in 50 of them 40 days old
        # (older than the partitions the migration makes: the default one).
        conn.execute("""
            INSERT INTO pgfence.jobs (kind, queue, status, attempt, max_attempts, max_reclaims, created_at,
                                      run_at, started_at, finished_at, last_error)
            SELECT 'noop', 'default', (ARRAY['done', 'failed', 'cancelled'])[1 + g %% 3], 1, 5, 3,
                   f - interval '1 minute', f - interval '1 minute', f - interval '1 second', f,
                   CASE WHEN g %% 3 = 1 THEN 'boom ' || g END
              FROM generate_series(1, %s) g,
                   LATERAL (SELECT now() - CASE WHEN g %% 50 = 0 THEN interval '40 days'
                                                ELSE (g %% 10) * interval '1 day' END
                                   - g * interval '1 ms' AS f) t""", (finished,))
        conn.execute("INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, 100)")
        conn.execute("""UPDATE pgfence.jobs SET status = 'running', attempt = 1, locked_by = 'w',
                               lease_until = now() + interval '1 minute', started_at = now()
                         WHERE id > %s AND id <= %s + 10""", (finished, finished))
        before = dict(conn.execute("SELECT status, count(*) FROM pgfence.jobs GROUP BY status").fetchall())
        sample = conn.execute("""SELECT id, status, attempt, last_error, finished_at FROM pgfence.jobs
                                  WHERE id IN (4, 7, 50) ORDER BY id""").fetchall()
        days = scalar(conn, """SELECT count(DISTINCT (finished_at AT TIME ZONE 'UTC')::date) FROM pgfence.jobs
                                WHERE finished_at > now() - interval '31 days'""")

    out = pgfence("migrate", dsn=empty_dsn, timeout=600)
    assert (out.returncode, out.stdout, out.stderr) == (0, "applied 0009_job_history\napplied 0010_jobs_autovacuum\napplied 0011_periodic\n"
                                                                   "applied 0012_operations\napplied 0013_bulk_actions\n"
                                                                   "applied 0014_job_results\napplied 0015_attempt_tracebacks\n"
                                                                   "applied 0016_names_check_cost\n"
                                                                   "applied 0017_concurrency_limits\n", "")

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert dict(conn.execute("SELECT status, count(*) FROM pgfence.jobs GROUP BY status").fetchall()) == \
            {"queued": before["queued"], "running": before["running"]} == {"queued": 90, "running": 10}
        assert dict(conn.execute("SELECT status, count(*) FROM pgfence.job_history GROUP BY status").fetchall()) == \
            {s: before[s] for s in ("done", "failed", "cancelled")}
        assert sum(before[s] for s in ("done", "failed", "cancelled")) == finished
        assert scalar(conn, "SELECT count(DISTINCT id) FROM pgfence.job_history") == finished
        assert scalar(conn, "SELECT count(*) FROM pgfence.job_history_default") == finished // 50
        # A partition for each day with jobs, today's and three ahead (some of
        # which may coincide with the days of jobs), and the default one.
        ahead = scalar(conn, """SELECT count(*) FROM generate_series(0, 3) d
                                 WHERE to_regclass('pgfence.job_history_' ||
                                       to_char((now() AT TIME ZONE 'UTC')::date + d, 'YYYYMMDD')) IS NOT NULL""")
        parts = scalar(conn, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgfence.job_history'::regclass")
        assert ahead == 4 and days + 3 <= parts - 1 <= days + 4
        # Moved jobs are found by id, unchanged.
        assert conn.execute("""SELECT id, status, attempt, last_error, finished_at FROM pgfence.all_jobs
                                WHERE id IN (4, 7, 50) ORDER BY id""").fetchall() == sample

    out = pgfence("retry", "7", dsn=empty_dsn)
    assert (out.returncode, out.stdout) == (0, "requeued 1 job(s): 7\n")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT status, attempt, max_attempts FROM pgfence.jobs WHERE id = 7").fetchall() == \
            [("queued", 1, 2)]
        kept = scalar(conn, """SELECT count(*) FROM pgfence.job_history
                                WHERE (finished_at AT TIME ZONE 'UTC')::date
                                      >= (now() AT TIME ZONE 'UTC')::date - 7""")
        old_partitions = scalar(conn, """
            SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'pgfence.job_history'::regclass AND c.relname <> 'job_history_default'
               AND to_date(substr(c.relname, 13), 'YYYYMMDD') < (now() AT TIME ZONE 'UTC')::date - 7""")
        assert old_partitions >= 1

    out = pgfence("prune", "--retention", "7d", dsn=empty_dsn, timeout=300)
    assert (out.returncode, out.stdout) == \
        (0, f"dropped {old_partitions} day partition(s) of history, deleted {finished // 50} finished job(s)\n")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT count(*) FROM pgfence.job_history") == kept
        assert scalar(conn, "SELECT count(*) FROM pgfence.jobs") == 101
        assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = 7") == "queued"


def test_migration_0009_moves_finished_jobs_into_history(empty_dsn):
    upgrade_a_database_of(empty_dsn, 20_000)


@pytest.mark.slow
def test_migration_0009_moves_a_million_finished_jobs_into_history(empty_dsn):
    upgrade_a_database_of(empty_dsn, 1_000_000)
