"""Which children the arbiter kills (SIGKILL), and when: a job past its
timeout by the grace period, a job whose lease is lost beyond the grace
period, a drain past its deadline."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable

from pgfence.prefork.children import Child, Kill, Stop
from pgfence.prefork.helper import kill
from pgfence.prefork.slots import SlotTable

log = logging.getLogger("pgfence.arbiter")


def kill_overdue(children: Iterable[Child], table: SlotTable, *, now: float, grace: float,
                 stopping: Stop | None, drain_deadline: float) -> float:
    """Kill the children past their time; when the next such kill falls due
    (monotonic; ``inf`` if none)."""
    next_kill = float("inf")
    for c in children:
        if stopping and now >= drain_deadline:
            if c.killed is not Kill.STOP:
                c.killed = Kill.STOP
                if stopping is Stop.GRACEFUL:
                    log.warning("worker %d (pid %d) still busy at the drain deadline: killing it",
                                c.number, c.pid)
                else:
                    log.info("killing worker %d (pid %d)", c.number, c.pid)
                kill(c.pid, signal.SIGKILL)
            continue
        if c.killed_for_lost:
            continue   # SIGKILL sent; waiting for waitpid
        for held in table.held(c.slot):
            # A timeout is a hard limit: the child was told at the timeout
            # (its lease marked lost, while the job stays held), and is
            # killed the grace period after it, whether it ticks or not;
            # its job is then released at once as a timed-out attempt.
            if held.timeout is not None and held.started_at is not None:
                kill_at = held.started_at + held.timeout + grace
                if now >= kill_at:
                    c.killed = Kill.LOST
                    log.warning("worker %d (pid %d) still runs job %d attempt %d %gs after its timeout "
                                "(%gs): killing it", c.number, c.pid, held.job_id, held.attempt, grace,
                                held.timeout)
                    kill(c.pid, signal.SIGKILL)
                    break
                next_kill = min(next_kill, kill_at)
            renewal = table.read_renewal(c.slot, held.entry, held.job_id, held.attempt)
            if renewal and renewal.lost and renewal.lost != "timeout":
                if now - renewal.lost_at >= grace:
                    # An outage lost the lease, not the job or its worker.
                    c.killed = Kill.OUTAGE if renewal.lost == "renewal_failed" else Kill.LOST
                    log.warning("worker %d (pid %d) still runs job %d attempt %d %gs after its lease was lost "
                                "(%s): killing it", c.number, c.pid, held.job_id, held.attempt, grace,
                                renewal.lost)
                    kill(c.pid, signal.SIGKILL)
                    break
                next_kill = min(next_kill, renewal.lost_at + grace)
    return next_kill
