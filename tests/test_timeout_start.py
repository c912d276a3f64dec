"""The handler timeout counts from the handler's start, not from the claim
(review F4), and the heartbeat's copy of a lease's first deadline starts
when the claim was sent, as the worker's own does (review F16)."""

from __future__ import annotations

import signal
import time

import pytest

from pgtools import scalar
from pgfence import enqueue, handler
from pgfence.prefork.child import SlotLeases
from pgfence.renewal.process import RenewalProcess
from pgfence.settings import Settings
from pgfence.prefork.slots import ACTIVE, SlotTable
from pgfence.worker.engine import Worker
from test_supervisor_faults import supervisors  # noqa: F401 - the fixture

#: Each job of the batch works this long; the timeout is shorter than the
#: wait of the batch's last jobs, longer than any one job.
WORK = 0.4
TIMEOUT = 1.0


def test_jobs_waiting_behind_others_in_a_batch_do_not_time_out(conn, make_worker):
    """Four jobs of 0.4 s in one batch with a 1 s timeout: the third and
    fourth start 0.8 s and 1.2 s after the claim, and each handler checks
    its lease at its end (1.2 s and 1.6 s after the claim).  Counted from
    the claim they timed out and were retried; counted from each handler's
    start, all four are done on their first attempt."""
    started: dict[int, float] = {}

    @handler("t_batch_timeout", queue="tb", timeout=TIMEOUT)
    def batch_timeout(job):
        started[job.id] = time.monotonic()
        time.sleep(WORK)
        job.check()

    ids = [enqueue(conn, "t_batch_timeout", queue="tb") for _ in range(4)]
    worker = make_worker(queues=("tb",), batch=4, lease=30, retention=None)
    claimed_before = time.monotonic()
    assert worker.run(burst=True).outcomes == {"done": 4}
    assert max(started.values()) - claimed_before >= TIMEOUT   # the last one did wait past the timeout
    assert conn.execute("SELECT id, status, attempt, last_error FROM pgfence.all_jobs ORDER BY id").fetchall() == \
        [(i, "done", 1, None) for i in ids]


def test_a_handler_running_past_its_timeout_still_times_out(conn, make_worker):
    """The limit still holds, from the handler's start."""
    @handler("t_over", queue="to", timeout=0.3, max_attempts=1)
    def over(job):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            job.check()
            time.sleep(0.01)

    job_id = enqueue(conn, "t_over", queue="to")
    worker = make_worker(queues=("to",), lease=30, retention=None)
    assert worker.run(burst=True).outcomes == {"failed": 1}
    assert conn.execute("SELECT status, attempt, last_error FROM pgfence.all_jobs WHERE id = %s",
                        (job_id,)).fetchone() == ("failed", 1, "timed out after 0.3s")


@pytest.fixture
def slot_table():
    table = SlotTable(nslots=1, njobs=4)
    table.set_slot(0, ACTIVE, 4242, 1)
    return table


def test_the_slot_publishes_the_claims_send_time_and_the_handlers_start(dsn, conn, slot_table):
    """The heartbeat process's copy of a lease gets the worker's own first
    deadline (claim sent + lease), not one counted from after the claim
    returned; the handler's start is published when it starts, and only
    then does the timeout count."""
    for _ in range(3):
        enqueue(conn, "noop", queue="ts")
    leases = SlotLeases(slot_table, 0, tick_interval=0.05)
    worker = Worker(dsn, Settings(queues=("ts",), batch=3, lease=30, timeout=5, retention=None),
                    name="t-slot", heartbeat=leases)
    process = RenewalProcess(dsn, Settings(lease=30), slot_table, liveness=5.0, instance="5e1f5e1f")
    try:
        jobs = worker.claim()
        assert len(jobs) == 3
        leases.sync()   # tick
        copies, _keys = process.held_leases(time.monotonic())
        # claimed_at + lease, as the worker computes its deadline: deadline -
        # 30 is not always claimed_at exactly in floating point.
        assert sorted((c.id, c.deadline, c.claimed_at + 30) for c in copies) == \
            sorted((j.id, j.lease.deadline, j.lease.deadline) for j in jobs)
        assert {c.started_at for c in copies} == {None}
        assert {h.started_at for h in slot_table.held(0)} == {None}
        assert not any(c.timed_out(time.monotonic() + 3600) for c in copies)

        first = jobs[0]
        assert worker.run_job(first) == "done"
        held = {h.job_id: h for h in slot_table.held(0)}
        assert first.id not in held and len(held) == 2
        # The next job's handler starts: published, and copied next round.
        second = jobs[1]
        second.lease.started_at = time.monotonic()
        leases.handler_started(second.lease)
        assert {h.job_id: h.started_at for h in slot_table.held(0)} == {second.id: second.lease.started_at,
                                                                          jobs[2].id: None}
        copies = {c.id: c for c in process.held_leases(time.monotonic())[0]}
        assert copies[second.id].started_at == second.lease.started_at
        assert copies[second.id].timed_out(second.lease.started_at + 5)
        assert not copies[jobs[2].id].timed_out(time.monotonic() + 3600)
    finally:
        process.manager.stop()
        worker.close()
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'done'") == 1


BATCH_MODULE = "pgfence_batch_timeout_handlers"
BATCH_SOURCE = f"""\
import time

from pgfence import handler


@handler("t_batched", timeout={TIMEOUT})
def batched(job):
    time.sleep({WORK})
    job.check()
"""


def test_under_pgfence_run_the_heartbeat_and_the_arbiter_count_from_the_handlers_start(
        dsn, conn, tmp_path, supervisors):  # noqa: F811
    """One child claims four 0.4 s jobs with a 1 s timeout in one batch:
    the last starts 1.2 s after the claim.  Counted from the claim, the
    heartbeat process told the child it timed out and the arbiter killed
    it (1 s + the 0.5 s grace); counted from the handler's start (published
    in the slot), all four are done on their first attempt, nobody killed."""
    (tmp_path / f"{BATCH_MODULE}.py").write_text(BATCH_SOURCE)
    ids = [enqueue(conn, "t_batched") for _ in range(4)]
    sup = supervisors(workers=1, batch=4, lost_lease_kill_after=0.5, handlers=BATCH_MODULE)
    sup.wait(lambda: scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status <> 'running' "
                                  "AND (status = 'done' OR last_error IS NOT NULL)") == 4, 20, "four jobs ended")
    assert conn.execute("SELECT id, status, attempt, reclaims, last_error FROM pgfence.all_jobs ORDER BY id").fetchall() \
        == [(i, "done", 1, 0, None) for i in ids]
    log = sup.log()
    assert "killing it" not in log and "timed out" not in log, log
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0
