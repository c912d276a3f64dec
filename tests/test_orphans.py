"""Jobs of a dead child are released by the heartbeat manager, fenced."""

from __future__ import annotations

from pgtools import job_row
from supervisor import enqueue
from supervisor.child import worker_name
from supervisor.heartbeat_process import HeartbeatProcess
from supervisor.queries import q
from supervisor.settings import Settings
from supervisor.slots import FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable


def claim_as(conn, owner: str, n: int = 1) -> list[tuple[int, int]]:
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": n, "worker": owner, "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": True}).fetchall()
    return [(r[0], r[5]) for r in rows]


def test_a_claim_the_dead_child_never_published_is_found_by_its_name(dsn, conn):
    table = SlotTable(nslots=4, njobs=2)
    published, unpublished, other = (enqueue(conn, "noop") for _ in range(3))
    dead = worker_name(4242, 7)
    # The child published one claim and died right after committing another.
    [(a, attempt_a), (b, attempt_b)] = claim_as(conn, dead, 2)
    assert (a, b) == (published, unpublished)
    table.set_slot(1, ORPHANED_CRASH, 4242, 7)
    table.publish(1, 0, a, attempt_a, 30.0, 0.0, None)
    # Another live worker's claim is not touched.
    [(c, _)] = claim_as(conn, worker_name(4343, 8))
    process = HeartbeatProcess(dsn, Settings(lease=30), table, liveness=1.0)
    try:
        assert process.release_orphans() == 2
    finally:
        process.manager.stop()
    for job_id in (a, b):
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == \
            ("queued", 1, 1, None, "worker died")
    assert (job_row(conn, c)["status"], job_row(conn, c)["locked_by"]) == ("running", worker_name(4343, 8))
    assert table.slot(1)[0] == FREE and table.held(1) == []


def test_a_shutdown_kill_releases_without_counting_a_reclaim(dsn, conn):
    table = SlotTable(nslots=2, njobs=1)
    job_id = enqueue(conn, "noop")
    owner = worker_name(5151, 1)
    [(_, attempt)] = claim_as(conn, owner)
    table.set_slot(0, ORPHANED_STOP, 5151, 1)
    process = HeartbeatProcess(dsn, Settings(lease=30), table, liveness=1.0)
    try:
        assert process.release_orphans() == 1
    finally:
        process.manager.stop()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("queued", attempt, 0, None)
