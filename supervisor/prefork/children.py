"""The arbiter's bookkeeping of its worker children: each child's life
(:class:`Child`), why one was killed, how the arbiter stops, and the policy
for workers that die unasked (:class:`Restarts`: boot failures in a row, the
crash streak and their backoffs)."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from enum import StrEnum

from pgfence.observe import metrics
from pgfence.prefork import child
from pgfence.prefork.helper import MAX_BOOT_FAILURES, boot_backoff
from pgfence.prefork.slots import FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable

log = logging.getLogger("pgfence.arbiter")

#: A child that was up and crashes within this many seconds of its start
#: extends the crash streak; one that lived longer starts a new streak.
CRASH_STREAK_WINDOW = 30.0


#: From the second crash of a streak, the next start waits 0.2 s, 0.4 s,
#: 0.8 s... up to this many seconds: a job or handler that kills every child
#: that touches it must not make the arbiter fork in a tight loop.
CRASH_BACKOFF_MAX = 30.0


def crash_backoff(streak: int) -> float:
    """Seconds before the next start after ``streak`` crashes in a row."""
    return 0.0 if streak < 2 else min(CRASH_BACKOFF_MAX, 0.1 * 2 ** (streak - 1))


class Stop(StrEnum):
    """How the arbiter stops."""

    #: TERM: children finish their jobs within the graceful timeout.
    GRACEFUL = "graceful"
    #: INT, QUIT, a halt: children killed, their jobs released at once.
    FAST = "fast"


class Kill(StrEnum):
    """Why the arbiter killed a child (SIGKILL)."""

    #: The drain's deadline passed, or a fast stop.
    STOP = "stop"
    #: It still ran a job past its timeout, or a job whose lease was lost,
    #: beyond the grace period.
    LOST = "lost"
    #: As LOST, but the lease was lost to a renewal that failed (the database
    #: out of reach): its jobs are released without counting against their
    #: max_reclaims.
    OUTAGE = "outage"


@dataclass
class Child:
    """A worker child's life, as the arbiter sees it: started, then perhaps
    asked to go (TERM), then perhaps killed, for one reason."""

    pid: int
    number: int
    slot: int
    started: float
    #: When the arbiter asked it to go (TERM): a reload, a scale down, a drain.
    term_sent_at: float | None = None
    #: Why the arbiter killed it, if it did.
    killed: Kill | None = None

    @property
    def retiring(self) -> bool:
        """Asked to go: it no longer counts among the workers."""
        return self.term_sent_at is not None

    @property
    def killed_for_lost(self) -> bool:
        return self.killed in (Kill.LOST, Kill.OUTAGE)


@dataclass
class ArbiterStats:
    spawned: int = 0
    restarts: int = 0
    #: Children that replaced themselves (max_jobs_per_child,
    #: max_memory_per_child): not restarts.
    recycled: int = 0


@dataclass
class Restarts:
    """Workers that died unasked: boot failures in a row (children that
    never came up), the crash streak (children that crash in the middle of a
    job soon after they were up), and when the next start may come."""

    boot_failures: int = 0
    #: Children in a row that crashed soon after they were up.
    crash_streak: int = 0
    respawn_at: float = 0.0

    def unplanned_exit(self, c: Child, code: int, how: str, *, booted: bool, holding: bool) -> str | None:
        """Count a child that died unasked and delay the next start as the
        backoffs say; the message to halt with if workers keep dying at
        start."""
        if not booted:
            self.boot_failures += 1
            if self.boot_failures >= MAX_BOOT_FAILURES:
                return f"workers keep dying at start ({self.boot_failures} in a row, last {how}); stopping"
            self.respawn_at = time.monotonic() + boot_backoff(self.boot_failures)
        else:
            self.boot_failures = 0
            self.crashed_after_boot(c, code, holding=holding)
        return None

    def crashed_after_boot(self, c: Child, code: int, *, holding: bool) -> None:
        """Delay the next start when children keep crashing in the middle of
        a job soon after they were up (a job whose handler kills its worker
        would otherwise crash one child after another at once),
        exponentially and capped.  A child that lived a healthy while, left
        cleanly, or died idle (killed from outside between jobs: it did its
        work) resets the streak."""
        lived = time.monotonic() - c.started
        if code == 0 or c.killed_for_lost or not holding:
            self.crash_streak = 0
            return
        self.crash_streak = self.crash_streak + 1 if lived < CRASH_STREAK_WINDOW else 1
        delay = crash_backoff(self.crash_streak)
        if delay:
            self.respawn_at = max(self.respawn_at, time.monotonic() + delay)
            log.warning("worker %d crashed %d times in a row, each within %gs of its start: next start in %.1fs",
                        c.number, self.crash_streak, CRASH_STREAK_WINDOW, delay)


def settle_exit(c: Child, status: int, how: str, table: SlotTable, *, stopping: Stop | None,
                stats: ArbiterStats, restarts: Restarts) -> tuple[bool, str | None]:
    """A worker child exited (``status``, ``how``): log it, leave its slot
    to the renewal process if it may hold jobs (orphaned) or free it, and
    count it if it died unasked.  Whether its slot was orphaned (the renewal
    process is then woken to release its jobs), and the message to halt
    with, if any."""
    held = table.held(c.slot)
    # The child ticked at least once: it connected and was ready to work.
    booted = table.slot(c.slot).alive_at > 0
    code = os.waitstatus_to_exitcode(status)
    # A child that replaced itself after its job or memory limit left as
    # cleanly as one asked to go: a fresh one takes its place, and it is
    # no crash (no restart counted, no crash streak, no boot failure).
    recycled = code == child.RECYCLED
    planned = c.retiring or stopping or recycled
    clean = code == 0 or recycled
    level = logging.INFO if planned and clean else logging.WARNING
    if recycled:
        how = "recycled: starting a fresh worker in its place"
        stats.recycled += 1
    log.log(level, "worker %d (pid %d) %s%s", c.number, c.pid, how,
            f" holding {len(held)} job(s): releasing them" if held else "")
    # A child that was up and did not exit cleanly may also hold a claim
    # it had no time to publish: the heartbeat manager looks for those by
    # name.  One that never came up (never ticked) never claimed.
    orphaned = bool(held or (booted and not clean))
    if orphaned:
        stop_kill = c.killed in (Kill.STOP, Kill.OUTAGE) or stopping is not None
        table.set_state(c.slot, ORPHANED_STOP if stop_kill else ORPHANED_CRASH)
    else:
        table.clear_all(c.slot)
        table.set_state(c.slot, FREE)
    if code == child.BOOT_ERROR:
        return orphaned, f"worker {c.number} could not start (exit {code}); stopping"
    if not planned:
        stats.restarts += 1
        metrics.WORKER_RESTARTS.inc()
        return orphaned, restarts.unplanned_exit(c, code, how, booted=booted, holding=bool(held))
    return orphaned, None


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
