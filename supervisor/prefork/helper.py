"""A helper process of the arbiter: the renewal process (the heartbeat
manager) and the metrics server are each one ``HelperProcess``.

Both are supervised by one policy, the one the renewal process has always
had, so that no helper can make the arbiter fork in a tight loop:

- A helper that exits after it was *up* is restarted at once, and its count
  of failures goes back to zero.
- A helper that exits before it was up failed to start: the next start waits
  0.2 s, 0.4 s, 0.8 s... (``boot_backoff``), and after ``max_failures``
  such failures in a row the arbiter halts (exit status 1, one
  ``pgfence: error:`` line), as it does for workers that die at start.
- An exit the arbiter asked for (a reload, the shutdown) is neither.

What *up* means is the helper's own: the renewal process is up once it has
written its pid into the slot table after its first round; the metrics
server, which serves within milliseconds of its fork and has no round of its
own, once it has lived ``METRICS_UP_AFTER`` seconds (as supervisord's
``startsecs``).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from pgfence.prefork.slots import SlotTable

log = logging.getLogger("pgfence.arbiter")

#: This many helpers (or workers) in a row dying before they were up and the
#: arbiter halts instead of forking on.
MAX_BOOT_FAILURES = 5
#: The longest wait before the next start after failures to start.
BOOT_BACKOFF_MAX = 10.0
#: A metrics server that lived this long came up.  It runs no database round
#: that could prove it, and binds nothing (the socket is the arbiter's), so a
#: second of life shows that its imports, its server and its signal handlers
#: work.
METRICS_UP_AFTER = 1.0


def boot_backoff(failures: int) -> float:
    """Seconds before the next start after ``failures`` failures to start
    in a row: 0.2, 0.4, 0.8... capped at ``BOOT_BACKOFF_MAX``."""
    return min(BOOT_BACKOFF_MAX, 0.1 * 2.0 ** failures)


class HelperProcess:
    """One helper process: its pid, when it started, its failures to start
    in a row, and when it may start again.

    ``start`` forks the process and returns its pid (it never returns in
    the child).  ``is_up(pid, lived)`` says whether the process that just
    exited, after ``lived`` seconds, had come up.  ``detail`` is appended to
    the "started" log line."""

    def __init__(self, name: str, start: Callable[[], int], is_up: Callable[[int, float], bool], *,
                 max_failures: int = MAX_BOOT_FAILURES, detail: Callable[[], str] | None = None) -> None:
        self.name = name
        self._start = start
        self._is_up = is_up
        self._detail = detail
        self.max_failures = max_failures
        self.pid: int | None = None
        #: When the running process was forked (monotonic).
        self.started = 0.0
        #: Failures to start in a row.
        self.failures = 0
        #: No start before this (monotonic).
        self.respawn_at = 0.0
        #: The running process was told to go (TERM for a reload, or KILL
        #: for a stall): its exit is expected, not news.
        self.signalled = False
        #: The next exit was asked for by a reload: restart at once, quietly.
        self._reloading = False
        #: Retired at the shutdown: never started again.
        self.retired = False

    @property
    def gave_up(self) -> bool:
        """Failed to start ``max_failures`` times in a row: not started again."""
        return self.failures >= self.max_failures

    def due(self, now: float) -> bool:
        """Not running, and may (and should) be started now."""
        return self.pid is None and not self.retired and not self.gave_up and now >= self.respawn_at

    def spawn(self) -> int:
        pid = self._start()
        self.pid = pid
        self.started = time.monotonic()
        self.signalled = False
        log.info("%s started (pid %d)%s", self.name, pid, self._detail() if self._detail else "")
        return pid

    def kill(self, sig: int) -> None:
        """Send ``sig`` to the running process, if any."""
        if self.pid is not None:
            if sig in (signal.SIGTERM, signal.SIGKILL):
                self.signalled = True
            kill(self.pid, sig)

    def reload(self) -> None:
        """Stop the running process so that a new one, started at once,
        takes the new settings."""
        if self.pid is not None:
            self._reloading = True
            self.kill(signal.SIGTERM)

    def retire(self) -> None:
        """At the shutdown: stop it, and never start another."""
        self.retired = True
        self.kill(signal.SIGTERM)

    def exited(self, pid: int, how: str) -> str | None:
        """The process ``pid`` exited (``how``, as in "killed by SIGKILL").
        Apply the policy; return the message to halt with, or None."""
        lived = time.monotonic() - self.started
        self.pid = None
        now = time.monotonic()
        if self.retired:
            return None
        if self._reloading:
            self._reloading = False
            self.failures = 0
            self.respawn_at = now
            log.info("%s stopped for the reload; starting a new one", self.name)
            return None
        if self._is_up(pid, lived):
            self.failures = 0
            self.respawn_at = now
            log.warning("%s %s; restarting it", self.name, how)
            return None
        self.failures += 1
        if self.gave_up:
            return f"the {self.name} keeps dying at start ({self.failures} in a row, last {how}); stopping"
        delay = boot_backoff(self.failures)
        self.respawn_at = now + delay
        log.warning("%s %s before it was up; restarting it in %.1fs", self.name, how, delay)
        return None


class Helpers:
    """The arbiter's helper processes: the renewal process (the heartbeat
    manager) and, when a socket was bound for it, the metrics server."""

    def __init__(self, renewal: HelperProcess, metrics: HelperProcess | None) -> None:
        self.renewal = renewal
        self.metrics = metrics

    def all(self) -> list[HelperProcess]:
        return [self.renewal] + ([self.metrics] if self.metrics is not None else [])

    def find(self, pid: int) -> HelperProcess | None:
        return next((h for h in self.all() if h.pid == pid), None)

    def spawn_due(self) -> None:
        """Start each helper process that is due: not running, past its
        backoff, not given up on."""
        now = time.monotonic()
        for helper in self.all():
            if helper.due(now):
                helper.spawn()

    def next_start(self) -> float:
        """When the next helper process is due to start (monotonic; ``inf``
        if none waits), so the loop wakes for it rather than a turn later."""
        waiting = [h.respawn_at for h in self.all() if h.pid is None and not h.retired and not h.gave_up]
        return min(waiting, default=float("inf"))

    def renewal_silence(self, table: SlotTable, now: float) -> float:
        """Seconds since the running renewal process last went round its
        loop (since its start, before its first round)."""
        stats = table.renewal_stats()
        last = stats.alive_at if stats.pid == self.renewal.pid else self.renewal.started
        return now - max(last, self.renewal.started)

    def retire_all(self, sleep: Callable[[float], None], reap: Callable[[], None]) -> None:
        """At the shutdown: stop every helper, reaping (``reap``) for up to
        five seconds, then kill what is left."""
        helpers = self.all()
        for helper in helpers:
            helper.retire()
        end = time.monotonic() + 5
        while any(h.pid is not None for h in helpers) and time.monotonic() < end:
            sleep(0.05)
            reap()
        for helper in helpers:
            helper.kill(signal.SIGKILL)

    def check_renewal(self, table: SlotTable, stall: float) -> None:
        """Kill a renewal process that stopped going round its loop for
        longer than ``stall`` seconds (a renewal stuck on a network that
        drops packets); the loop starts a new one.  Children stay safe
        meanwhile: each gives up its leases at their own deadline."""
        if self.renewal.pid is None or self.renewal.signalled:
            return
        silence = self.renewal_silence(table, time.monotonic())
        if silence > stall:
            log.warning("heartbeat manager (pid %d) stalled for %.0fs: killing it", self.renewal.pid, silence)
            self.renewal.kill(signal.SIGKILL)


def metrics_url(sock: socket.socket) -> str:
    """Where the metrics server listens on ``sock``, as its start line says it."""
    host, port = sock.getsockname()[:2]
    return f" on http://{host}:{port}/metrics"


def kill(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; a process already gone is no error."""
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise
