"""What one scheduler round does with a schedule: pure decisions, tested
without a database.

:func:`due` says which ticks since the schedule's ``checked_until`` the
round enqueues and how many it misses (catch-up); :func:`decide` applies the
overlap policy to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pgfence.scheduling.schedule import CATCH_UP_MAX, Schedule


@dataclass
class Due:
    #: Ticks to decide, oldest first.
    ticks: list[datetime] = field(default_factory=list)
    #: Ticks left out (no scheduler ran at their time; catch_up).
    missed: int = 0


def due(schedule: Schedule, checked_until: datetime, now: datetime, grace: float) -> Due:
    """The ticks in ``(checked_until, now]``.

    While some scheduler runs, ``checked_until`` trails the database's clock
    by a round at most, and every tick since is decided.  A gap longer than
    ``grace`` means no scheduler ran for a while (every supervisor was
    stopped): its ticks are caught up as ``catch_up`` says: ``latest`` the
    most recent one only, ``none`` none, ``all`` those within
    ``catch_up_window`` (at most CATCH_UP_MAX, the newest).
    """
    if now <= checked_until:
        return Due()
    gap = (now - checked_until).total_seconds()
    if gap <= grace:
        return Due(list(schedule.ticks(checked_until, now)))
    if schedule.catch_up == "none":
        return Due([], schedule.count(checked_until, now))
    if schedule.catch_up == "latest":
        total = schedule.count(checked_until, now)
        if total == 0:
            return Due()
        latest = _latest(schedule, checked_until, now)
        return Due([latest], total - 1)
    start = max(checked_until, now - timedelta(seconds=schedule.catch_up_window))
    kept = list(schedule.ticks(start, now))[-CATCH_UP_MAX:]
    return Due(kept, schedule.count(checked_until, now) - len(kept))


def _latest(schedule: Schedule, after: datetime, until: datetime) -> datetime:
    if schedule.every is not None:
        # The last multiple of the interval at or before `until`.
        step = timedelta(seconds=schedule.every)
        return schedule.next_tick(until - step)
    found = list(schedule.ticks(after, until))
    return found[-1]


@dataclass(frozen=True)
class Action:
    #: "dequeue" (a queued tick's turn: enqueue its job now), "enqueue",
    #: "skip" (recorded skipped) or "queue" (recorded queued).
    verb: str
    tick: datetime


def decide(overlap: str, ticks: list[datetime], busy: bool, queued: list[datetime]) -> list[Action]:
    """The round's actions for one schedule, in order.

    ``busy``: the job of its last enqueued tick is still queued or running;
    ``queued``: its ticks waiting behind it (overlap ``queue``), oldest
    first.  ``skip`` enqueues a tick only while no run is outstanding (one
    enqueued in this round counts); ``allow`` enqueues every tick; ``queue``
    keeps one run outstanding and the others in line, in tick order.
    """
    actions: list[Action] = []
    if overlap == "allow":
        return [Action("enqueue", tick) for tick in ticks]
    if overlap == "skip":
        for tick in ticks:
            actions.append(Action("skip" if busy else "enqueue", tick))
            busy = True
        return actions
    line = list(queued)
    if not busy and line:
        actions.append(Action("dequeue", line.pop(0)))
        busy = True
    for tick in ticks:
        if busy or line:
            actions.append(Action("queue", tick))
        else:
            actions.append(Action("enqueue", tick))
            busy = True
    return actions
