"""Vacuum of pgfence.jobs: the statistics pgfence reads, the warnings of
the metrics server, and pgfence's own VACUUM, on a real PostgreSQL.

Each test turns autovacuum off for the table (the machine's server has it
off already; the embedded one does not), so that only the VACUUMs a test
runs change the counts it checks.
"""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest

from metricstools import total
from pgtools import env_for, scalar, wait_for
from pgfence.observe.vacuum import UntimedAges, VacuumWatch
from pgfence.store.vacuum import VacuumStats, vacuum_stats
from pgfence.worker.vacuum import SelfVacuum

ROWS = 300


def make_dead(conn: psycopg.Connection, rows: int = ROWS) -> None:
    """``rows`` jobs inserted, then updated once: ``rows`` dead versions.
    On a queue no worker serves, so that a `pgfence run` leaves them be."""
    conn.execute("ALTER TABLE pgfence.jobs SET (autovacuum_enabled = false)")
    conn.execute("INSERT INTO pgfence.jobs (kind, payload, queue) SELECT 'noop', '{}', 'parked' "
                 "FROM generate_series(1, %s)", (rows,))
    conn.execute("UPDATE pgfence.jobs SET priority = priority + 1")


def counts(conn: psycopg.Connection) -> tuple[int, int]:
    return conn.execute("SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables "
                        "WHERE relid = 'pgfence.jobs'::regclass").fetchone()


def dead_counted(conn: psycopg.Connection, rows: int = ROWS) -> None:
    # The statistics of a session reach the server when its transaction ends.
    wait_for(lambda: counts(conn)[0] >= rows, message=f"{rows} dead row versions counted")


@pytest.fixture
def role(dsn, conn):
    """A role that may read pgfence.jobs but owns neither it nor the database."""
    name = f"pgfence_r_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE ROLE {name} LOGIN")
    conn.execute(f"GRANT USAGE ON SCHEMA pgfence TO {name}")
    conn.execute(f"GRANT SELECT ON pgfence.jobs TO {name}")
    yield name
    conn.execute(f"REVOKE ALL ON pgfence.jobs FROM {name}")
    conn.execute(f"REVOKE ALL ON SCHEMA pgfence FROM {name}")
    conn.execute(f"DROP ROLE {name}")


def as_role(dsn: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, user=role)


def test_self_vacuum_removes_the_dead_row_versions(dsn, conn):
    make_dead(conn)
    dead_counted(conn)
    dead, vacuums = counts(conn)
    vacuum = SelfVacuum(dsn, dead_tuples=ROWS)
    try:
        done = vacuum.run_once()
    finally:
        vacuum.stop()
    assert (done.result, done.dead_before, done.dead_after) == ("done", dead, 0)
    assert counts(conn) == (0, vacuums + 1)
    assert vacuum.wait() == 15.0


def test_self_vacuum_leaves_a_table_under_its_bound_alone(dsn, conn):
    make_dead(conn)
    dead_counted(conn)
    before = counts(conn)
    vacuum = SelfVacuum(dsn, dead_tuples=10 * ROWS)
    try:
        assert vacuum.run_once().result == "below"
    finally:
        vacuum.stop()
    assert counts(conn) == before


def test_a_held_horizon_keeps_the_dead_versions_and_backs_self_vacuum_off(dsn, conn):
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgfence.jobs")     # the snapshot is taken: the horizon is held
        make_dead(conn)
        dead_counted(conn)
        dead, vacuums = counts(conn)
        vacuum = SelfVacuum(dsn, dead_tuples=ROWS, interval=1.0, max_interval=4.0)
        try:
            rounds = [vacuum.run_once() for _ in range(3)]
            stats = vacuum_stats(conn)
        finally:
            vacuum.stop()
        assert [(r.result, r.dead_after) for r in rounds] == [("held", dead)] * 3
        assert counts(conn) == (dead, vacuums + 3)
        assert vacuum.wait() == 4.0      # 1, 2, 4: doubled per useless VACUUM, capped
        holder_pid = holder.info.backend_pid
        assert stats.horizon_holder is not None and stats.horizon_holder.startswith(f"pid {holder_pid} ")
        assert "idle in transaction" in stats.horizon_holder and stats.horizon_age > 0
    # The horizon moves on: the next VACUUM removes them, and the wait is back to the interval.
    vacuum = SelfVacuum(dsn, dead_tuples=ROWS, interval=1.0, max_interval=4.0)
    try:
        assert vacuum.run_once().result == "done"
    finally:
        vacuum.stop()
    assert counts(conn) == (0, vacuums + 4)


def test_a_role_that_may_not_vacuum_warns_once_and_sends_no_vacuum(dsn, conn, role, caplog):
    make_dead(conn)
    dead_counted(conn)
    before = counts(conn)
    vacuum = SelfVacuum(as_role(dsn, role), dead_tuples=ROWS)
    caplog.set_level(logging.WARNING, logger="pgfence.vacuum")
    try:
        rounds = [vacuum.run_once().result for _ in range(2)]
    finally:
        vacuum.stop()
    assert rounds == ["not_permitted", "not_permitted"]
    assert counts(conn) == before
    warnings = [r.getMessage() for r in caplog.records if r.name == "pgfence.vacuum"]
    assert len(warnings) == 1 and "may not VACUUM" in warnings[0]


def test_the_owner_of_the_database_may_vacuum(dsn, conn, role):
    dbname = conn.info.dbname
    conn.execute(f'ALTER DATABASE "{dbname}" OWNER TO {role}')
    try:
        with psycopg.connect(as_role(dsn, role), autocommit=True) as theirs:
            assert vacuum_stats(theirs).may_vacuum
    finally:
        conn.execute(f'ALTER DATABASE "{dbname}" OWNER TO {conn.info.user}')


def test_stats_see_the_table_and_the_autovacuum_switches(dsn, conn):
    conn.execute("ALTER TABLE pgfence.jobs SET (autovacuum_enabled = false)")
    stats = vacuum_stats(conn)
    server_on = scalar(conn, "SELECT current_setting('autovacuum')::boolean")
    assert (stats.autovacuum_server, stats.autovacuum_table, stats.autovacuum) == (server_on, False, False)
    assert stats.may_vacuum and stats.since_vacuum >= 0 and stats.untimed == []
    conn.execute("ALTER TABLE pgfence.jobs RESET (autovacuum_enabled)")
    assert vacuum_stats(conn).autovacuum_table is True


def test_a_prepared_transaction_holds_the_horizon(dsn, conn):
    if scalar(conn, "SELECT current_setting('max_prepared_transactions')::int") == 0:
        pytest.skip("max_prepared_transactions is 0 on this server")
    gid = f"pgfence-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn) as holder:
        holder.execute("INSERT INTO pgfence.jobs (kind, payload) VALUES ('noop', '{}')")
        holder.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        stats = wait_for(lambda: (lambda s: s if s.horizon_age > 0 else None)(vacuum_stats(conn)))
        assert stats.horizon_holder == f"prepared transaction {gid}"
    finally:
        conn.execute(f"ROLLBACK PREPARED '{gid}'")


def test_another_roles_transaction_is_seen_without_its_start(dsn, conn, role):
    """A role without pg_read_all_stats sees that another role's session
    holds an xmin, not since when: it is aged from when it was first seen."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        pid = holder.info.backend_pid
        with psycopg.connect(as_role(dsn, role), autocommit=True) as theirs:
            seen = vacuum_stats(theirs)
        mine = vacuum_stats(conn)
    assert seen.horizon_holder is None and seen.horizon_age == 0
    assert [entry.split(" ", 1)[1] for entry in seen.untimed] == [f"pid {pid} (state hidden)"]
    assert mine.horizon_holder is not None and mine.horizon_holder.startswith(f"pid {pid} ")


# -- the warnings (pure) ------------------------------------------------------------------


def stats(dead: int = 0, age: float = 0.0, holder: str | None = None, untimed: list[str] | None = None) -> VacuumStats:
    return VacuumStats(dead_tuples=dead, live_tuples=10, since_vacuum=5.0, vacuum_count=0, autovacuum_count=0,
                       autovacuum_server=False, autovacuum_table=True, horizon_age=age, horizon_holder=holder,
                       untimed=untimed or [], may_vacuum=True)


def test_dead_tuples_warn_once_when_they_stay_over_the_bound_until_under_half_of_it():
    watch = VacuumWatch(warn_dead_tuples=1000, warn_horizon=None, dead_warn_after=120.0)
    # (seconds, dead): over the bound for 60 s, then under (a vacuum round
    # came); over again for 120 s: one warning; it stays, then falls to
    # 600 (not yet re-armed), 400 (re-armed), and over for 120 s once more.
    timeline = [(0, 10), (15, 1000), (75, 5000), (90, 10), (100, 1200), (200, 3000), (220, 4000), (300, 9000),
                (315, 600), (330, 1500), (460, 1500), (475, 400), (490, 1200), (600, 1300), (610, 1300)]
    seen = [len(watch.observe(stats(dead), float(t))) for t, dead in timeline]
    assert seen == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_the_horizon_warns_once_per_hold():
    watch = VacuumWatch(warn_dead_tuples=None, warn_horizon=60.0)
    ages = (5.0, 61.0, 300.0, 1.0, 90.0)
    warned = [watch.observe(stats(age=a, holder="pid 7 (report, idle in transaction)"), 0.0) for a in ages]
    assert [len(w) for w in warned] == [0, 1, 0, 0, 1]
    assert "held for 61s by pid 7 (report, idle in transaction)" in warned[1][0]


def test_holders_without_a_start_are_aged_from_first_sight():
    ages = UntimedAges()
    assert ages.oldest(["slot:s1:100 replication slot s1"], 10.0) == (0.0, "replication slot s1")
    assert ages.oldest(["slot:s1:100 replication slot s1", "backend:9:120 pid 9 (x, state hidden)"], 40.0) == \
        (30.0, "replication slot s1")
    # The slot's xmin moved on: a new key, aged from now; the backend is older.
    assert ages.oldest(["slot:s1:130 replication slot s1", "backend:9:120 pid 9 (x, state hidden)"], 50.0) == \
        (10.0, "pid 9 (x, state hidden)")
    assert ages.oldest([], 60.0) == (0.0, None)
    watch = VacuumWatch(None, 20.0)
    watch.observe(stats(untimed=["backend:9:120 pid 9 (x, state hidden)"]), 0.0)
    assert "pid 9" in watch.observe(stats(untimed=["backend:9:120 pid 9 (x, state hidden)"]), 25.0)[0]


# -- through pgfence run ------------------------------------------------------------------


def test_pgfence_run_vacuums_the_table_and_exports_its_state(dsn, conn, runs):
    make_dead(conn)
    dead_counted(conn)
    dead, vacuums = counts(conn)
    run = runs(dsn, "--workers", "1", "--self-vacuum-dead-tuples", str(ROWS))
    # The heartbeat manager's first look comes at its start.
    wait_for(lambda: counts(conn) == (0, vacuums + 1), timeout=30, message="pgfence's VACUUM")
    parsed = wait_for(lambda: (lambda p: p if total(p, "pgfence_self_vacuums_total", result="done") == 1
                               else None)(run.try_scrape()), timeout=30, message="the self-vacuum counted")
    assert total(parsed, "pgfence_jobs_autovacuum_enabled", setting="table") == 0
    assert total(parsed, "pgfence_jobs_autovacuum_enabled", setting="server") == \
        int(scalar(conn, "SELECT current_setting('autovacuum')::boolean"))
    assert total(parsed, "pgfence_xmin_horizon_age_seconds") >= 0
    assert total(parsed, "pgfence_jobs_live_tuples") == ROWS
    assert dead == ROWS
