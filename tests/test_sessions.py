"""pgfence's own sessions: a frozen worker's row locks are freed by the
idle-in-transaction timeout (issue 10, point 14), and a busy worker does not
keep every notification it receives (point 5).  Real PostgreSQL, a real
worker process, real signals."""

from __future__ import annotations

import json
import os
import signal

import psycopg
import pytest
from pgtools import scalar, spawn, wait_for

from pgfence.store import client as client_store
from pgfence.errors import ConfigError
from pgfence.settings import Settings


def enqueue(conn, kind: str = "noop", payload: dict | None = None, queue: str = "default") -> int:
    return client_store.enqueue(conn, {"kind": kind, "payload": json.dumps(payload or {}), "queue": queue,
                                       "priority": 0, "run_at": None, "delay": 0.0, "max_attempts": 5,
                                       "dedupe_key": None, "max_reclaims": 3})


def row_lockable(dsn: str, job_id: int) -> bool:
    with psycopg.connect(dsn) as c:
        try:
            c.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE NOWAIT", (job_id,))
            return True
        except psycopg.errors.LockNotAvailable:
            return False


def test_a_frozen_worker_inside_a_transaction_frees_its_row_locks(dsn, conn):
    """A worker stopped (SIGSTOP) in the middle of a fenced() block keeps its
    session idle in transaction, holding the job's row lock: without a
    timeout, until the server's TCP keepalive (hours; a stopped process still
    answers keepalives: for ever).  With --idle-in-transaction-timeout 1 the
    server ends that session and the row can be locked again."""
    job_id = enqueue(conn, "hold_row", {"seconds": 60})
    proc = spawn("work", "--handlers", "pgfence.handlers.builtin,session_handlers", "--idle-in-transaction-timeout", "1",
                 "--lease", "30", "--name", "frozen", dsn=dsn)
    try:
        pid = wait_for(lambda: scalar(conn, "SELECT min(pid) FROM pg_stat_activity WHERE datname = current_database() "
                                             "AND application_name = "
                                             "'pgfence worker frozen' AND state = 'idle in transaction'"),
                       timeout=20, message="the worker idle in its fenced() transaction")
        assert not row_lockable(dsn, job_id)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: row_lockable(dsn, job_id), timeout=15, message="the frozen worker's row lock freed")
        assert scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == 0
        assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "running"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.communicate(timeout=10)


def test_worker_and_heartbeat_sessions_carry_the_timeout(dsn, make_worker):
    worker = make_worker("w-idle", idle_in_transaction_timeout=7.5)
    assert worker.conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("7500ms",)
    assert worker.conn.execute("SHOW tcp_keepalives_idle").fetchone()[0] in ("5", "0")   # 0 on a Unix socket
    from pgfence.renewal.renewer import HeartbeatManager

    manager = HeartbeatManager(dsn, idle_in_transaction_timeout=7.5)
    try:
        manager._open()
        with manager._pool.connection() as c:
            assert c.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("7500ms",)
    finally:
        manager.stop()
    off = make_worker("w-off", idle_in_transaction_timeout=None)
    server_default = off.conn.execute("SELECT reset_val FROM pg_settings "
                                      "WHERE name = 'idle_in_transaction_session_timeout'").fetchone()[0]
    assert off.conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] in ("0", server_default)


@pytest.mark.parametrize("value", [0.5, 86401.0, float("inf"), -1.0])
def test_the_idle_in_transaction_timeout_is_bounded(value):
    with pytest.raises(ConfigError, match=r"^invalid idle-in-transaction-timeout: must be 1s to 86400s, or none"):
        Settings(idle_in_transaction_timeout=value)


def test_a_busy_worker_keeps_a_bounded_notification_backlog(dsn, conn, make_worker):
    """Every enqueue transaction, in any queue, notifies every listening
    worker; psycopg keeps what arrives while the worker is not waiting for
    it.  A worker that always finds work never waited: 4,000 enqueues into
    another queue left 4,000 notifications in its connection.  Now each
    claim that finds work drops what was received before it, so at most one
    round's notifications are ever held."""
    rounds, per_round = 4, 1000
    for _ in range(rounds):
        enqueue(conn, queue="busy")
    worker = make_worker("w-busy", queues=("busy",))
    worker.conn  # noqa: B018 - connects and LISTENs
    backlog = []
    for _ in range(rounds):
        # One transaction per enqueue, as producers make them.
        conn.execute(f"DO $$ BEGIN FOR i IN 1..{per_round} LOOP "
                     "PERFORM pgfence.enqueue('noop', '{}', 'other'); COMMIT; END LOOP; END $$")
        assert worker.run_once() == 1
        backlog.append(len(worker._conn._notifies_backlog or ()))
    assert worker.stats.outcomes == {"done": rounds}
    assert max(backlog) <= per_round, backlog
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE queue = 'other'") == rounds * per_round


def test_a_heartbeat_frozen_before_its_commit_frees_the_rows_within_its_window(dsn, conn):
    """A renewal locks its jobs' rows; a heartbeat manager stopped between
    the renewal and its COMMIT kept them locked for the session's
    idle-in-transaction timeout (60s), and a reclaim skips locked rows, so
    the jobs went unreclaimed that long after their leases ran out (seen in
    the fault matrix's stop-renewal case).  A renewal's own timeout is its
    window: the server ends the frozen session within it."""
    from pgfence.renewal.renewer import HeartbeatManager
    from pgfence.store import renewals
    from pgfence.worker.lease import Lease

    job_id = enqueue(conn)
    conn.execute("UPDATE pgfence.jobs SET status = 'running', attempt = 1, locked_by = 'w', "
                 "lease_until = now() + interval '1.5 seconds' WHERE id = %s", (job_id,))
    manager = HeartbeatManager(dsn, default_lease=1.5, idle_in_transaction_timeout=60.0)
    lease = Lease(job_id, 1, 1.5)
    idle_ms = manager.renewal_idle_ms([lease])
    assert int(idle_ms) == int(manager.window([lease]) * 1000) < 1500
    frozen = psycopg.connect(dsn)
    try:
        frozen.execute("BEGIN")
        renewals.renewal_settings(frozen, statement_ms="5000", idle_ms=idle_ms)
        assert renewals.renew(frozen, [job_id], [1], [1.5]) == {(job_id, 1)}
        # The manager stops here, before its COMMIT.
        assert not row_lockable(dsn, job_id)
        wait_for(lambda: row_lockable(dsn, job_id), timeout=5, message="the frozen renewal's row lock freed")
    finally:
        frozen.close()
    # The session's own timeout still applies where it is shorter.
    short = HeartbeatManager(dsn, default_lease=30.0, idle_in_transaction_timeout=1.0)
    assert short.renewal_idle_ms([Lease(job_id, 1, 30.0)]) == "1000"
    off = HeartbeatManager(dsn, default_lease=30.0, idle_in_transaction_timeout=None)
    assert off.renewal_idle_ms([Lease(job_id, 1, 30.0)]) == str(int(off.window([Lease(job_id, 1, 30.0)]) * 1000))
