"""The supervisors registry: each ``pgfence run`` keeps a row of
``pgfence.supervisors`` fresh, for the operators' views.

A thread of the heartbeat manager's process (which already holds
connections; the arbiter keeps none), with one autocommit connection of its
own, so that no renewal round waits for it.  Every :data:`INTERVAL` seconds
it writes the supervisor's host, the arbiter's pid, the workers aimed at,
the version, when the supervisor started, ``last_seen = now()`` and, from
the slot table, each live child and the jobs it holds (their kind and queue
read from pgfence.jobs in the same statement).  On a clean stop the row is
deleted; a supervisor that dies leaves a row that stops being refreshed,
and readers take as up only rows seen within 30 seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket

from pgfence.background import Service
from pgfence.prefork.slots import ACTIVE, SlotTable
from pgfence.store import db, operations

log = logging.getLogger("pgfence.heartbeat")

#: Seconds between two refreshes of the row.
INTERVAL = 5.0


def pgfence_version() -> str:
    """The installed version (``unknown`` in a checkout that is not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("pgfence")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Presence(Service[int]):
    """Keeps this supervisor's row of pgfence.supervisors: :meth:`run_once`
    writes it once, :meth:`start` every ``interval`` from a thread, and
    :meth:`stop` ends the thread and deletes the row."""

    thread_name = "pgfence-presence"
    application_name = "pgfence presence"
    failure = "supervisors registry not refreshed"

    def __init__(self, dsn: str, table: SlotTable, *, instance: str, arbiter_pid: int,
                 started_at: dt.datetime, interval: float = INTERVAL) -> None:
        super().__init__(dsn, interval=interval, log=log)
        self.table = table
        self.instance = instance
        self.arbiter_pid = arbiter_pid
        self.started_at = started_at
        self.host = socket.gethostname()
        self.version = pgfence_version()
        self.beats = 0

    def snapshot(self) -> tuple[list[operations.ChildInfo], list[operations.HeldJob]]:
        """The live children (by number) and the jobs each holds, from the
        slot table."""
        children: list[operations.ChildInfo] = []
        held: list[operations.HeldJob] = []
        slots = []
        for slot in range(self.table.nslots):
            info = self.table.slot(slot)
            if info.state == ACTIVE and info.pid:
                slots.append((info.number, info.pid, slot))
        for index, (number, pid, slot) in enumerate(sorted(slots)):
            children.append(operations.ChildInfo(number, pid))
            held.extend(operations.HeldJob(index, h.job_id, h.attempt) for h in self.table.held(slot))
        return children, held

    def run_once(self) -> int:
        """Insert or refresh the row; the number of live children written."""
        children, held = self.snapshot()
        conn = self.connection()
        with db.translated(self.dsn):
            operations.supervisor_beat(conn, instance=self.instance, host=self.host, pid=self.arbiter_pid,
                                       workers=self.table.arbiter_state().target, version=self.version,
                                       started_at=self.started_at, children=children, held=held)
        self.beats += 1
        return len(children)

    def stop(self, *, remove: bool = True) -> None:
        """End the thread; with ``remove``, delete the row (a clean stop)."""
        self.halt()
        if remove:
            try:
                conn = self.connection()
                with db.translated(self.dsn):
                    operations.supervisor_gone(conn, self.instance)
            except Exception as exc:  # noqa: BLE001 - the row then ages out
                log.warning("supervisors registry row not removed: %s", db.scrub(db.first_line(exc), self.dsn))
        if not self.running:
            self.close()


def arbiter_started_at(started: float | None) -> dt.datetime:
    """When the supervisor started (the arbiter's ``time.time()``), as an
    aware datetime; now when not given."""
    if started is None:
        return dt.datetime.now(dt.UTC)
    return dt.datetime.fromtimestamp(started, dt.UTC)
