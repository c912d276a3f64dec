"""The heartbeat manager's pool after an outage: the first round after the
database is back renews, whatever backoff the pool's reconnects were in.

psycopg_pool waits 1 s, 2 s, 4 s... between failed attempts to connect:
before, a job with a short lease lost it once right after an outage,
because the renewal's pool was still waiting out that backoff.  Real
PostgreSQL: the outage closes the database to new connections and ends the
heartbeat's session."""

from __future__ import annotations

import time

import psycopg

from pgtools import scalar, wait_for, with_dbname
from pgfence import enqueue
from pgfence.renewal.renewer import HeartbeatManager
from pgfence.store.queries import q
from pgfence.worker.lease import Lease

APP = "pgfence heartbeat"


def heartbeat_backends(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
        (APP,)).fetchall()]


def lease_until(conn: psycopg.Connection, job_id: int):
    return scalar(conn, "SELECT lease_until FROM pgfence.all_jobs WHERE id = %s", (job_id,))


def test_the_first_round_after_an_outage_renews_without_waiting_out_the_pools_backoff(dsn, conn):
    """Renewals every 0.3 s of a 30 s lease; a 4.5 s outage.  The pool's
    backoff had it try at about 0.3, 1.3, 3.3 and 7.3 s after the cut (10%
    jitter), so the database back at 4.5 s was reached 1.8 s or more later.
    Now each round starved of a connection starts a new attempt at once."""
    job_id = enqueue(conn, "effect", {"seconds": 0}, queue="hb-reconnect")
    sent_at = time.monotonic()
    rows = conn.execute(q("claim"), {
        "queues": ["hb-reconnect"], "batch": 1, "worker": "owner", "lease": 30.0, "lease_kinds": [],
        "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}).fetchall()
    assert [(r[0], r[5]) for r in rows] == [(job_id, 1)]
    lease = Lease(job_id, 1, 30.0, "hb-reconnect", "effect", deadline=sent_at + 30.0)
    manager = HeartbeatManager(dsn, default_lease=30.0, interval=0.3)
    manager.track(lease)
    dbname = conn.info.dbname
    admin = psycopg.connect(with_dbname(dsn, "postgres"), autocommit=True)
    try:
        manager.start()
        first = lease_until(conn, job_id)
        wait_for(lambda: lease_until(conn, job_id) > first, timeout=10, message="a renewal before the outage")
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        pids = heartbeat_backends(conn)
        assert len(pids) == 1, pids
        assert scalar(conn, "SELECT pg_terminate_backend(%s)", (pids[0],)) is True
        cut_at = time.monotonic()
        wait_for(lambda: heartbeat_backends(conn) == [], timeout=10, message="the heartbeat's session ended")
        # Rounds fail from now on; the lease (30 s) outlives the outage.
        wait_for(lambda: lease.failing, timeout=5, message="a failed round")
        before = lease_until(conn, job_id)
        while time.monotonic() < cut_at + 4.5:
            assert lease_until(conn, job_id) == before      # nothing renews while the database refuses
            time.sleep(0.05)
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        back_at = time.monotonic()
        wait_for(lambda: lease_until(conn, job_id) > before, timeout=20, message="a renewal after the outage")
        renewed_after = time.monotonic() - back_at
    finally:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        admin.close()
        manager.stop()
    assert renewed_after < 1.0, f"first renewal {renewed_after:.2f}s after the database was back"
    assert lease.lost_reason is None
    assert scalar(conn, "SELECT attempt FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == 1
