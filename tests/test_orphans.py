"""Jobs of a dead child are released by the heartbeat manager, fenced."""

from __future__ import annotations

import os
import socket

from pgtools import job_row
from pgfence import enqueue
from pgfence.identity import worker_name
from pgfence.renewal.process import RenewalProcess
from pgfence.store.queries import q
from pgfence.settings import Settings
from pgfence.prefork.slots import FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable

#: The instance id of the supervisor these tests play.
INSTANCE = "0a1b2c3d"


def claim_as(conn, owner: str, n: int = 1) -> list[tuple[int, int]]:
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": n, "worker": owner, "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": True,
                                     "kinds": None, "not_kinds": None}).fetchall()
    return [(r[0], r[5]) for r in rows]


def test_a_claim_the_dead_child_never_published_is_found_by_its_name(dsn, conn):
    table = SlotTable(nslots=4, njobs=2)
    published, unpublished, other = (enqueue(conn, "noop") for _ in range(3))
    dead = worker_name(4242, 7, INSTANCE)
    # The child published one claim and died right after committing another.
    [(a, attempt_a), (b, attempt_b)] = claim_as(conn, dead, 2)
    assert (a, b) == (published, unpublished)
    table.set_slot(1, ORPHANED_CRASH, 4242, 7)
    table.publish(1, 0, a, attempt_a, 30.0, 0.0, None)
    # Another live worker's claim is not touched.
    [(c, _)] = claim_as(conn, worker_name(4343, 8, INSTANCE))
    process = RenewalProcess(dsn, Settings(lease=30), table, liveness=1.0, instance=INSTANCE)
    try:
        assert process.release_orphans() == 2
    finally:
        process.manager.stop()
    for job_id in (a, b):
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == \
            ("queued", 1, 1, None, "worker died")
    assert (job_row(conn, c)["status"], job_row(conn, c)["locked_by"]) == ("running", worker_name(4343, 8, INSTANCE))
    assert table.slot(1)[0] == FREE and table.held(1) == []


def test_a_shutdown_kill_releases_without_counting_a_reclaim(dsn, conn):
    table = SlotTable(nslots=2, njobs=1)
    job_id = enqueue(conn, "noop")
    owner = worker_name(5151, 1, INSTANCE)
    [(_, attempt)] = claim_as(conn, owner)
    table.set_slot(0, ORPHANED_STOP, 5151, 1)
    process = RenewalProcess(dsn, Settings(lease=30), table, liveness=1.0, instance=INSTANCE)
    try:
        assert process.release_orphans() == 1
    finally:
        process.manager.stop()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("queued", attempt, 0, None)


def test_a_dead_childs_release_never_touches_another_supervisors_job_of_the_same_name(dsn, conn):
    """Two supervisors in containers with the same host name: each arbiter is
    pid 1, so their children draw the same pids and numbers.  Only the
    instance id tells them apart, and the dead child's release by name takes
    only what that very child held."""
    table = SlotTable(nslots=2, njobs=1)
    mine, theirs, old_style = (enqueue(conn, "noop") for _ in range(3))
    [(a, _)] = claim_as(conn, worker_name(13, 2, INSTANCE))          # this supervisor's child, dead unpublished
    other = worker_name(13, 2, "ffee0011")                           # the other supervisor's live child
    [(b, _)] = claim_as(conn, other)
    [(c, _)] = claim_as(conn, f"{socket.gethostname()}:13:w2")      # a name without any instance id
    assert (a, b, c) == (mine, theirs, old_style)
    table.set_slot(0, ORPHANED_CRASH, 13, 2)
    process = RenewalProcess(dsn, Settings(lease=30), table, liveness=1.0, instance=INSTANCE)
    try:
        assert process.release_orphans() == 1
    finally:
        process.manager.stop()
    assert (job_row(conn, mine)["status"], job_row(conn, mine)["locked_by"]) == ("queued", None)
    for job_id, owner in ((theirs, other), (old_style, f"{socket.gethostname()}:13:w2")):
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("running", 1, 0, owner)


def test_every_supervisor_and_worker_draws_its_own_instance_id():
    from pgfence.identity import new_instance_id
    from pgfence.worker.engine import default_name

    ids = {new_instance_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 8 and int(i, 16) >= 0 for i in ids)
    host = socket.gethostname()
    assert worker_name(13, 2, "0a1b2c3d") == f"{host}:13:w2:0a1b2c3d"
    first, second = default_name(), default_name()
    assert first != second
    assert first.rsplit(":", 1)[0] == f"{host}:{os.getpid()}"
