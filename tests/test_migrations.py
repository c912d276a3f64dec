"""Migrations: idempotent, safe under concurrent migrators, and the declared
schema of the jobs table."""

from __future__ import annotations

import re

import psycopg
import pytest

from pgtools import pgfence, scalar, spawn, wait_for
from pgfence.store import migrate

EXPECTED_MIGRATIONS = [(1, "jobs"), (2, "handler_tables"), (3, "jobs_fillfactor"), (4, "complete_fenced"),
                       (5, "claim_indexes"), (6, "kinds"), (7, "putbacks_tracebacks"),
                       (8, "names"), (9, "job_history"), (10, "jobs_autovacuum"), (11, "periodic"),
                       (12, "operations"), (13, "bulk_actions"), (14, "job_results"),
                       (15, "attempt_tracebacks"), (16, "names_check_cost"), (17, "concurrency_limits")]


def schema_dump(conn: psycopg.Connection, *, with_applied_at: bool = True) -> dict:
    """Everything the migrations declare, in a comparable form."""
    return {
        "relations": conn.execute("""
            SELECT relname, relkind FROM pg_class
             WHERE relnamespace = 'pgfence'::regnamespace ORDER BY relname""").fetchall(),
        "columns": conn.execute("""
            SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default,
                   is_identity, identity_generation
              FROM information_schema.columns WHERE table_schema = 'pgfence'
             ORDER BY table_name, ordinal_position""").fetchall(),
        "indexes": conn.execute("""
            SELECT tablename, indexname, indexdef FROM pg_indexes
             WHERE schemaname = 'pgfence' ORDER BY tablename, indexname""").fetchall(),
        "constraints": conn.execute("""
            SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
              FROM pg_constraint WHERE connamespace = 'pgfence'::regnamespace
             ORDER BY 1, 2""").fetchall(),
        "comments": conn.execute("""
            SELECT c.relname, d.objsubid, d.description FROM pg_description d
              JOIN pg_class c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
             WHERE c.relnamespace = 'pgfence'::regnamespace ORDER BY 1, 2""").fetchall(),
        "functions": conn.execute("""
            SELECT oid::regprocedure::text, md5(prosrc), obj_description(oid, 'pg_proc') FROM pg_proc
             WHERE pronamespace = 'pgfence'::regnamespace ORDER BY 1""").fetchall(),
        "migrations": conn.execute(
            "SELECT version, name" + (", applied_at" if with_applied_at else "") +
            " FROM pgfence.migrations ORDER BY version").fetchall(),
    }


def test_available_migrations_are_the_expected_files():
    assert [(m.version, m.name) for m in migrate.available()] == EXPECTED_MIGRATIONS


def test_applying_twice_changes_nothing(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert [(m.version, m.name) for m in migrate.pending(conn)] == EXPECTED_MIGRATIONS
        assert [(m.version, m.name) for m in migrate.apply(conn)] == EXPECTED_MIGRATIONS
        first = schema_dump(conn)
        assert [row[:2] for row in first["migrations"]] == EXPECTED_MIGRATIONS
        assert len(first["columns"]) > 20 and len(first["indexes"]) >= 6

        assert migrate.apply(conn) == []
        assert migrate.pending(conn) == []
        assert schema_dump(conn) == first

    out = pgfence("migrate", dsn=empty_dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "schema up to date\n", "")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert schema_dump(conn) == first


def test_concurrent_migrators_apply_the_schema_once(empty_dsn, dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as holder:
        # Hold the migrators' lock so that both are started and waiting on it
        # before either can begin: the race is forced, not hoped for.
        holder.execute("SELECT pg_advisory_lock(%s)", (migrate.LOCK_KEY,))
        procs = [spawn("migrate", dsn=empty_dsn) for _ in range(2)]
        try:
            wait_for(lambda: scalar(holder, """
                SELECT count(*) FROM pg_locks
                 WHERE locktype = 'advisory' AND NOT granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""") == 2,
                     timeout=30, message="both migrators waiting on the advisory lock")
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (migrate.LOCK_KEY,))
        results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]

        assert [(rc, err) for _out, err, rc in results] == [(0, ""), (0, "")]
        assert sorted(out for out, _err, _rc in results) == sorted(
            ["".join(f"applied {version:04d}_{name}\n" for version, name in EXPECTED_MIGRATIONS),
             "schema up to date\n"])
        assert holder.execute("SELECT version, name FROM pgfence.migrations ORDER BY version").fetchall() == \
            EXPECTED_MIGRATIONS
        applied = schema_dump(holder, with_applied_at=False)

    # Identical to a database migrated on its own.
    with psycopg.connect(dsn, autocommit=True) as reference:
        assert applied == schema_dump(reference, with_applied_at=False)


def test_commands_on_an_unmigrated_database_say_so(empty_dsn):
    out = pgfence("status", dsn=empty_dsn)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith("pgfence: error: pgfence schema missing (")
    assert out.stderr.rstrip().endswith("run 'pgfence migrate'")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT to_regnamespace('pgfence') IS NULL")


SPEC_COLUMNS = {
    # name: (data_type, nullable)
    "id": ("bigint", "NO"),
    "queue": ("text", "NO"),
    "kind": ("text", "NO"),
    "payload": ("jsonb", "NO"),
    "status": ("text", "NO"),
    "attempt": ("integer", "NO"),
    "max_attempts": ("integer", "NO"),
    "priority": ("integer", "NO"),
    "run_at": ("timestamp with time zone", "NO"),
    "locked_by": ("text", "YES"),
    "lease_until": ("timestamp with time zone", "YES"),
    "dedupe_key": ("text", "YES"),
    "last_error": ("text", "YES"),
    "created_at": ("timestamp with time zone", "NO"),
    "started_at": ("timestamp with time zone", "YES"),
    "finished_at": ("timestamp with time zone", "YES"),
}


def test_jobs_table_has_the_declared_columns(conn):
    cols = {r[0]: r[1:] for r in conn.execute("""
        SELECT column_name, data_type, is_nullable, is_identity, identity_generation
          FROM information_schema.columns
         WHERE table_schema = 'pgfence' AND table_name = 'jobs'""")}
    assert {name: cols[name][:2] for name in SPEC_COLUMNS if name in cols} == SPEC_COLUMNS
    # Beyond the spec: the reclaim budget, the put-backs of unknown kinds
    # (no attempt spent) and the last error's traceback.
    assert set(cols) - set(SPEC_COLUMNS) == {"reclaims", "max_reclaims", "putbacks", "last_traceback",
                                             "concurrency_key", "gated", "held_back"}
    assert (cols["concurrency_key"][:2], cols["gated"][:2], cols["held_back"][:2]) == \
        (("text", "YES"), ("boolean", "NO"), ("text", "YES"))
    assert cols["putbacks"][:2] == ("integer", "NO") and cols["last_traceback"][:2] == ("text", "YES")
    assert cols["id"][2:] == ("YES", "ALWAYS")
    assert [name for name, c in cols.items() if c[2] == "YES"] == ["id"]

    pk = conn.execute("""
        SELECT array_agg(a.attname::text) FROM pg_constraint c
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
         WHERE c.conrelid = 'pgfence.jobs'::regclass AND c.contype = 'p'""").fetchone()[0]
    assert pk == ["id"]

    check = scalar(conn, """
        SELECT pg_get_constraintdef(oid) FROM pg_constraint
         WHERE conrelid = 'pgfence.jobs'::regclass AND conname = 'jobs_status_check'""")
    assert re.findall(r"'(\w+)'::text", check) == ["queued", "running", "done", "failed", "cancelled"]

    assert scalar(conn, "SELECT count(*) FROM pg_indexes WHERE indexname = 'jobs_claim_idx'") == 0
    for name, status in (("jobs_queued_idx", "queued"), ("jobs_running_idx", "running")):
        indexdef = scalar(conn, "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,))
        assert "(queue, priority DESC, run_at, id)" in indexdef
        assert re.findall(r"'(\w+)'::text", indexdef) == [status]
        assert "lease_until" not in indexdef        # renewals stay HOT
    # Jobs held back by a concurrency limit are not in the claim's index.
    assert scalar(conn, "SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_queued_idx'").endswith(
        "WHERE ((status = 'queued'::text) AND (held_back IS NULL))")


def test_status_check_constraint_enforced(conn):
    for status in ("queued", "running"):
        conn.execute("INSERT INTO pgfence.jobs (kind, status, lease_until) VALUES ('noop', %s, now())", (status,))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_(live|status)_check"):
        conn.execute("INSERT INTO pgfence.jobs (kind, status) VALUES ('noop', 'paused')")
    # Finished jobs live in pgfence.job_history alone.
    for status in ("done", "failed", "cancelled"):
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_live_check"):
            conn.execute("INSERT INTO pgfence.jobs (kind, status) VALUES ('noop', %s)", (status,))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_running_lease_check"):
        conn.execute("INSERT INTO pgfence.jobs (kind, status) VALUES ('noop', 'running')")
    with pytest.raises(psycopg.errors.GeneratedAlways):
        conn.execute("INSERT INTO pgfence.jobs (id, kind) VALUES (12345, 'noop')")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 2


def test_jobs_table_autovacuum_options(dsn):
    """Migration 0010's per-table settings, as PostgreSQL reads them back."""
    with psycopg.connect(dsn) as conn:
        options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'pgfence.jobs'::regclass").fetchone()[0]
    assert sorted(options) == sorted([
        "fillfactor=80", "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000",
        "autovacuum_vacuum_insert_scale_factor=0", "autovacuum_vacuum_insert_threshold=1000",
        "autovacuum_vacuum_cost_delay=0", "autovacuum_analyze_scale_factor=0",
        "autovacuum_analyze_threshold=5000", "vacuum_truncate=false"])
