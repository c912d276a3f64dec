"""A database outage does not spend a job's reclaim budget (issue 10, point
13).  Real PostgreSQL: the outage closes the database to new connections
and ends the worker's sessions."""

from __future__ import annotations

import json
import threading

from pgtools import admin_connect, job_row, scalar, wait_for, with_dbname

from pgfence.store import client as client_store


def test_a_lease_lost_to_an_outage_is_released_without_a_reclaim(dsn, conn, make_worker):
    """The database goes away while a job runs: the heartbeat cannot renew,
    the lease is lost (renewal_failed) and the handler stops; the release
    cannot reach the database either.  Before, the job stayed running until
    the reclaim scan found its expired lease after the outage and counted a
    reclaim (a few outages quarantined a healthy job).  Now the worker
    releases it, fenced, as soon as the database answers: no reclaim."""
    job_id = client_store.enqueue(conn, {"kind": "sleep", "payload": json.dumps({"seconds": 2}), "queue": "outage",
                                         "priority": 0, "run_at": None, "delay": 0.0, "max_attempts": 5,
                                         "dedupe_key": None, "max_reclaims": 3})
    worker = make_worker("w-outage", queues=("outage",), lease=1.5, poll_interval=0.2)
    runner = threading.Thread(target=worker.run, kwargs={"max_jobs": 2}, daemon=True)
    runner.start()
    dbname = conn.info.dbname
    wait_for(lambda: job_row(conn, job_id)["status"] == "running", timeout=10, message="the job running")
    admin = admin_connect(with_dbname(dsn, "postgres"))
    admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
    try:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND application_name LIKE 'pgfence %%'")
        wait_for(lambda: worker.stats.outcomes.get("lost") == 1, timeout=15, message="the lease lost")
        # Out until the lease has run out by the database clock too.
        wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (job_id,)),
                 timeout=10, message="the lease expired in the database")
        assert job_row(conn, job_id)["status"] == "running"   # nobody could release it
        # The next attempt finishes at once: right after an outage the
        # heartbeat's pool may still be waiting out its reconnect backoff,
        # longer than this test's 1.5 s lease.
        conn.execute("UPDATE pgfence.jobs SET payload = '{\"seconds\": 0}' WHERE id = %s", (job_id,))
    finally:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        admin.close()
    runner.join(30)
    assert not runner.is_alive()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"]) == ("done", 2, 0)
    assert worker.stats.reclaimed == 0
    assert worker.stats.outcomes == {"lost": 1, "done": 1}
