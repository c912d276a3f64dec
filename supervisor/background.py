"""One shape for the background services of the heartbeat manager's process.

The self-vacuum (:mod:`pgfence.worker.vacuum`), the scheduler
(:mod:`pgfence.scheduling.scheduler`), the supervisors registry
(:mod:`pgfence.renewal.presence`) and the kinds record
(:mod:`pgfence.worker.kinds`) each run on a thread of their own with one
autocommit connection of their own, so that no renewal round waits for
them.  A :class:`Service` is that thread:

* :meth:`Service.run_once` is one step, and returns what it did;
* :meth:`Service.wait_after` says how long to wait after a step that
  returned, :meth:`Service.retry_wait` after one that raised, and
  :meth:`Service.finished` whether a step that returned was the last (a
  service with one thing to do: it ends once that is done);
* the thread's loop reschedules the next step *before* it runs this one, so
  an error in a step (logged with its arguments, the DSN's password masked)
  never stops the loop: the connection is closed, to be opened again, in the
  thread, by the next step;
* :meth:`Service.start` and :meth:`Service.stop` are idempotent, and a stop
  wakes the wait at once (a step under way ends first); :meth:`Service.wake`
  ends the wait too, for a step to run now.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, TypeVar

import psycopg

from pgfence.store import db

R = TypeVar("R")


class Service(Generic[R]):
    """A background step run from a thread until :meth:`stop`: subclasses
    give :meth:`run_once`, and the waits when they are not ``interval``."""

    #: The thread's name.
    thread_name = "pgfence-service"
    #: The ``application_name`` of the service's connection.
    application_name = "pgfence"
    #: What a failed step failed to do, for its log line.
    failure = "background step failed"
    #: How long :meth:`stop` waits for a step under way.
    join_timeout = 5.0

    def __init__(self, dsn: str, *, interval: float, log: logging.Logger) -> None:
        if interval <= 0:
            raise ValueError("a service's interval must be positive")
        self.dsn = dsn
        self.interval = interval
        self.log = log
        #: Steps that returned, and steps in a row that raised.
        self.steps = 0
        self.failures = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- what a subclass gives ---------------------------------------------

    def run_once(self) -> R:
        """One step; what it did."""
        raise NotImplementedError

    def wait_after(self, result: R) -> float:
        """Seconds from the end of a step that returned ``result`` to the next."""
        return self.interval

    def finished(self, result: R) -> bool:
        """Whether the step that returned ``result`` ends the service."""
        return False

    def retry_wait(self, failures: int) -> float:
        """Seconds from the start of a step that raised (the ``failures``-th
        in a row) to the next."""
        return self.interval

    def connected(self, conn: psycopg.Connection[Any]) -> None:
        """Called with each new connection, before the step that opened it uses it."""

    # -- the connection ----------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        """The service's connection, opened by the step that first needs it
        (in the thread when the thread runs the steps)."""
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.dsn, application_name=self.application_name)
            self.connected(self._conn)
        return self._conn

    def close(self) -> None:
        """Close the connection (the next step opens another)."""
        if self._conn is not None:
            self._conn.close()

    # -- one turn of the loop ------------------------------------------------

    def step(self) -> float:
        """Run one step as the thread does: never raises (an error is logged
        and the connection closed); returns the seconds until the next step."""
        # Rescheduled before it runs: a step that raises keeps this time.
        due = time.monotonic() + self.retry_wait(self.failures + 1)
        try:
            result = self.run_once()
        except Exception as exc:  # noqa: BLE001 - the next step tries again
            self.failures += 1
            self.log.warning("%s: %s", self.failure, db.scrub(db.first_line(exc), self.dsn))
            self.close()
            return max(0.0, due - time.monotonic())
        self.failures = 0
        self.steps += 1
        if self.finished(result):
            self._stop.set()
            self.close()
            return 0.0
        return max(0.0, self.wait_after(result))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.step())
            self._wake.clear()

    def wake(self) -> None:
        """End the wait before the next step: it runs at once (after the
        step under way, if one is)."""
        self._wake.set()

    # -- the thread ------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; a service already running is left as it is."""
        with self._lock:
            if self.running:
                return
            self._stop.clear()
            self._wake.clear()
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()

    def halt(self) -> None:
        """End the thread: wake its wait, and let a step under way end
        (for at most ``join_timeout`` seconds).  The connection is kept."""
        with self._lock:
            self._stop.set()
            self._wake.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.join_timeout)

    def stop(self) -> None:
        """End the thread and close the connection; idempotent.  A thread
        still in a step past the wait keeps its connection until it ends."""
        self.halt()
        if not self.running:
            self.close()
