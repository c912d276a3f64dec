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
import threading
from typing import Any

import psycopg

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


class Presence:
    """Keeps this supervisor's row of pgfence.supervisors: :meth:`run_once`
    writes it once, :meth:`start` every ``interval`` from a thread, and
    :meth:`stop` ends the thread and deletes the row."""

    def __init__(self, dsn: str, table: SlotTable, *, instance: str, arbiter_pid: int,
                 started_at: dt.datetime, interval: float = INTERVAL) -> None:
        self.dsn = dsn
        self.table = table
        self.instance = instance
        self.arbiter_pid = arbiter_pid
        self.started_at = started_at
        self.interval = interval
        self.host = socket.gethostname()
        self.version = pgfence_version()
        self.beats = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.dsn, application_name="pgfence presence")
        return self._conn

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

    def run_once(self) -> None:
        """Insert or refresh the row."""
        children, held = self.snapshot()
        conn = self._connection()
        with db.translated(self.dsn):
            operations.supervisor_beat(conn, instance=self.instance, host=self.host, pid=self.arbiter_pid,
                                       workers=self.table.arbiter_state().target, version=self.version,
                                       started_at=self.started_at, children=children, held=held)
        self.beats += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("supervisors registry not refreshed: %s", db.first_line(exc))
                if self._conn is not None:
                    self._conn.close()
            self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pgfence-presence", daemon=True)
        self._thread.start()

    def stop(self, *, remove: bool = True) -> None:
        """End the thread; with ``remove``, delete the row (a clean stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if remove:
            try:
                conn = self._connection()
                with db.translated(self.dsn):
                    operations.supervisor_gone(conn, self.instance)
            except Exception as exc:  # noqa: BLE001 - the row then ages out
                log.warning("supervisors registry row not removed: %s", db.first_line(exc))
        if self._conn is not None and (self._thread is None or not self._thread.is_alive()):
            self._conn.close()


def arbiter_started_at(started: float | None) -> dt.datetime:
    """When the supervisor started (the arbiter's ``time.time()``), as an
    aware datetime; now when not given."""
    if started is None:
        return dt.datetime.now(dt.UTC)
    return dt.datetime.fromtimestamp(started, dt.UTC)
