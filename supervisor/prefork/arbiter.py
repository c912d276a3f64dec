"""The arbiter: the parent process of ``pgfence run``.

It forks N worker children and two helper processes, the renewal process
(the heartbeat manager, which renews the children's leases) and the metrics
server; it reaps and respawns them, and acts on signals.  It holds no
database connection and runs no thread, so every fork is safe.  Signal
handlers only record the signal; the main loop dispatches it by name to a
``handle_<name>`` method.  Beside this module: the children's bookkeeping
(children.py), the signals (signals.py), forking (forking.py), reloading
(reloading.py), the kills (kills.py) and the helper processes (helper.py).

Signals:
  TERM        graceful drain: children stop claiming and finish their jobs
              within the graceful timeout; then they are killed and their
              jobs released.  A second TERM (or an INT) cuts the wait short.
  INT, QUIT   fast stop: children killed, their jobs released at once.
  HUP         reload: handler modules re-imported and settings re-read; new
              children start, the old ones drain.
  TTIN, TTOU  one worker more, one fewer.
  CHLD        wakes the loop, which reaps.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from prometheus_client import multiprocess

from pgfence import identity, registry
from pgfence.errors import ConfigError
from pgfence.observe import metrics
from pgfence.observe import server as metrics_server
from pgfence.prefork import child, forking, proctitle, reloading
from pgfence.prefork.children import (
    CRASH_BACKOFF_MAX,
    ArbiterStats,
    Child,
    Kill,
    Restarts,
    Stop,
    crash_backoff,
    describe,
    settle_exit,
)
from pgfence.prefork.helper import MAX_BOOT_FAILURES, METRICS_UP_AFTER, HelperProcess, Helpers, kill, metrics_url
from pgfence.prefork.kills import kill_overdue
from pgfence.prefork.sdnotify import SystemdReporter
from pgfence.prefork.signals import SIGNALS, SignalInbox
from pgfence.prefork.slots import ACTIVE, SlotTable
from pgfence.renewal import process as renewal_process
from pgfence.renewal.renewer import validate_heartbeat
from pgfence.scheduling.declared import declared, warn_unserved
from pgfence.settings import Settings

log = logging.getLogger("pgfence.arbiter")

# MAX_BOOT_FAILURES (from helper.py) applies to workers too: this many
# children in a row dying before they were up (connected and ticking) and the
# arbiter halts instead of forking on.
__all__ = ["CRASH_BACKOFF_MAX", "MAX_BOOT_FAILURES", "SIGNALS", "Arbiter", "Child", "Kill", "Stop", "crash_backoff"]


class Arbiter:
    def __init__(self, dsn: str, settings: Settings, *,
                 reload_settings: Callable[[], Settings] | None = None,
                 metrics_sock: socket.socket | None = None, instance: str | None = None):
        #: Bound by the caller before any fork; served by the metrics child.
        self.metrics_sock = metrics_sock
        self.systemd = SystemdReporter()
        validate_heartbeat(settings.heartbeat, registry.specs())
        warn_unserved(declared(settings))   # a schedule declared twice is refused here, at start
        self.dsn = dsn
        self.settings = settings
        #: In every child's name: tells this supervisor's children from
        #: another's with the same host name and pids (see identity.new_instance_id).
        self.instance = instance or identity.new_instance_id()
        #: When this supervisor started (wall clock): its started_at in
        #: pgfence.supervisors, kept across heartbeat manager restarts.
        self.started = time.time()
        self.reload_settings = reload_settings
        self.target = settings.workers
        self.children: dict[int, Child] = {}
        #: The renewal process (the heartbeat manager): it is up once it has
        #: written its pid into the table after its first round.
        self.renewal = HelperProcess("heartbeat manager", self._start_renewal,
                                     lambda pid, _lived: self.table.renewal_stats().pid == pid)
        #: The metrics server, when a socket was bound for it.
        self.metrics_process: HelperProcess | None = None
        if metrics_sock is not None:
            self.metrics_process = HelperProcess("metrics server", self._start_metrics,
                                                 lambda _pid, lived: lived >= METRICS_UP_AFTER,
                                                 detail=lambda: metrics_url(metrics_sock))
        self.helpers = Helpers(self.renewal, self.metrics_process)
        # A renewal round may take a statement timeout (one interval) plus a
        # pool wait (at least 1 s); silence well beyond that is a stall.
        self.renewal_stall = 3 * settings.heartbeat_interval + 5.0
        self.stats = ArbiterStats()
        self.inbox = SignalInbox()
        self._next_number = 1
        self.restarts = Restarts()
        self._stopping: Stop | None = None
        self._drain_deadline = 0.0
        self._exit_code = 0
        self.tick_interval = max(0.02, min(0.25, settings.heartbeat_interval / 4))
        # A child that has not ticked for this long gets no renewals.
        self.liveness = max(1.0, 4 * self.tick_interval)
        # Every job a child may hold at once has an entry: a claim takes no
        # more than the child's free slots, or its batch; a job ended but not
        # yet completed keeps its entry while its slot takes another.
        with_async = registry.has_async()
        self.table = SlotTable(nslots=max(256, 4 * settings.workers),
                               njobs=max(16, 2 * settings.capacity(with_async), settings.claim_size(with_async)))

    # -- signals (recorded by self.inbox, dispatched by the loop) ---------------

    def handle_term(self) -> None:
        if self._stopping:
            log.info("second stop signal: not waiting for the drain")
            self._drain_deadline = time.monotonic()
            return
        log.info("SIGTERM: draining %d workers (graceful timeout %gs)", len(self.children),
                 self.settings.graceful_timeout)
        self._stopping = Stop.GRACEFUL
        self._drain_deadline = time.monotonic() + self.settings.graceful_timeout
        for c in self.children.values():
            self._term(c)

    def handle_int(self) -> None:
        if self._stopping is Stop.GRACEFUL:
            self._drain_deadline = time.monotonic()
            return
        log.info("fast stop: killing %d workers and releasing their jobs", len(self.children))
        self._stopping = Stop.FAST
        self._drain_deadline = time.monotonic()

    handle_quit = handle_int

    def handle_hup(self) -> None:
        log.info("SIGHUP: reloading handlers and settings")
        try:
            self.reload()
        except ConfigError as exc:
            log.error("reload failed, keeping the running workers: %s", exc)
            return
        old = [c for c in self.children.values() if not c.retiring]
        for _ in range(self.target):
            self.spawn_worker()
        for c in old:
            self._term(c)
        # The renewal process takes the new settings too: stop it, and the
        # loop starts a new one at once (well within a renewal interval).
        self.renewal.reload()

    def handle_ttin(self) -> None:
        self.target += 1
        log.info("SIGTTIN: %d workers", self.target)

    def handle_ttou(self) -> None:
        if self.target > 1:
            self.target -= 1
        log.info("SIGTTOU: %d workers", self.target)

    def handle_chld(self) -> None:
        pass  # reap_workers runs every turn of the loop

    # -- lifecycle verbs -----------------------------------------------------------

    def reload(self) -> None:
        with reloading.schedules_kept_on_failure():
            self._reload()

    def _reload(self) -> None:
        reloading.reimport(self.settings.handlers)
        settings = self.settings
        if self.reload_settings is not None:
            settings = self.reload_settings()
            registry.load(settings.handlers)
            validate_heartbeat(settings.heartbeat, registry.specs())
        warn_unserved(declared(settings))
        if self.reload_settings is not None:
            self.settings = reloading.capped(settings, self.table.njobs)
            self.target = self.settings.workers
        # The re-imported modules are the new children's shared pages.
        reloading.freeze_heap()

    def spawn_worker(self) -> Child | None:
        slot = self.table.free_slot()
        if slot is None:
            log.error("no free worker slot; not starting another worker")
            return None
        number = self._next_number
        self._next_number += 1
        self.table.clear_all(slot)
        self.table.set_slot(slot, ACTIVE, 0, number)
        pid = forking.fork()
        if pid == 0:
            forking.close_inherited(self.metrics_sock, self.systemd)
            child.main(number, slot, self.table, self.dsn, self.settings, self.tick_interval, self.instance)
        self.table.set_slot(slot, ACTIVE, pid, number)
        c = self.children[pid] = Child(pid, number, slot, time.monotonic())
        self.stats.spawned += 1
        log.info("worker %d started (pid %d)", number, pid)
        return c

    def _start_metrics(self) -> int:
        sock = self.metrics_sock
        assert sock is not None, "a metrics server needs the socket bound for it"

        def main() -> int:
            forking.close_inherited(None, self.systemd)
            return metrics_server.main(sock, self.dsn, self.table, self.liveness, self.settings)

        return forking.fork_helper("metrics server", main)

    def _start_renewal(self) -> int:
        def main() -> int:
            forking.close_inherited(self.metrics_sock, self.systemd)
            # Looked up at each start (not imported by name), so that a
            # handler module loaded before the fork may replace it in tests.
            return renewal_process.main(self.dsn, self.settings, self.table, self.liveness, self.instance,
                                        self.started)

        return forking.fork_helper("heartbeat manager", main)

    def spawn_helpers(self) -> None:
        self.helpers.spawn_due()

    def reap_workers(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            how = describe(status)
            # Its live gauges go with it; its counters stay in the sums.
            multiprocess.mark_process_dead(pid)
            helper = self.helpers.find(pid)
            if helper is not None:
                halt = helper.exited(pid, how)
                if halt and not self._stopping:
                    self._halt(halt)
                continue
            c = self.children.pop(pid, None)
            if c is None:
                continue
            self._child_exited(c, status, how)

    def _child_exited(self, c: Child, status: int, how: str) -> None:
        orphaned, halt = settle_exit(c, status, how, self.table, stopping=self._stopping, stats=self.stats,
                                     restarts=self.restarts)
        if orphaned:
            self._wake_renewal()
        if halt:
            self._halt(halt)

    def _halt(self, message: str) -> None:
        log.error(message)
        print(f"pgfence: error: {message}", file=sys.stderr)
        self._exit_code = 1
        if not self._stopping:
            self._stopping = Stop.FAST
            self._drain_deadline = time.monotonic()

    def _wake_renewal(self) -> None:
        """Tell the renewal process that a child died: it releases the
        child's jobs at once."""
        self.renewal.kill(signal.SIGUSR1)

    def _term(self, c: Child) -> None:
        if c.term_sent_at is None:
            c.term_sent_at = time.monotonic()
            kill(c.pid, signal.SIGTERM)

    def murder_workers(self) -> float:
        """Kill children past their time: a job past its timeout by the grace
        period, a job whose lease is lost beyond the grace period, a drain
        past its deadline.  Returns when the next such kill falls due
        (monotonic; ``inf`` if none)."""
        now = time.monotonic()
        grace = self.settings.lost_lease_kill_after
        if self.settings.capacity(registry.has_async()) > 1:
            # A child that runs many jobs gives up a stuck one itself, at the
            # grace period, and drains its others before it exits: it is
            # killed only if it has not done so a graceful timeout later.
            grace += self.settings.graceful_timeout
        return kill_overdue(list(self.children.values()), self.table, now=now, grace=grace,
                            stopping=self._stopping, drain_deadline=self._drain_deadline)

    def check_renewal(self) -> None:
        self.helpers.check_renewal(self.table, self.renewal_stall)

    def manage_workers(self) -> None:
        if self._stopping:
            return
        active = [c for c in self.children.values() if not c.retiring]
        if len(active) < self.target and time.monotonic() >= self.restarts.respawn_at:
            for _ in range(self.target - len(active)):
                if self.spawn_worker() is None:
                    break
        elif len(active) > self.target:
            for c in sorted(active, key=lambda c: c.started)[: len(active) - self.target]:
                self._term(c)

    def _stopping_done(self) -> bool:
        return self._stopping is not None and not self.children

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        metrics.initialise(self.settings.queues, registry.kinds())
        self.inbox.install()
        proctitle.set(self._title())
        self.table.set_arbiter_state(time.monotonic(), self.target)
        reloading.freeze_heap()
        self.spawn_helpers()
        self.manage_workers()
        proctitle.set(self._title())
        log.info("arbiter started: %d workers on queues %s (instance %s)", self.target,
                 ",".join(self.settings.queues), self.instance)
        next_kill = float("inf")
        while True:
            self._sleep(max(0.0, min(0.1 if self._stopping else 0.5, next_kill - time.monotonic(),
                                     self.helpers.next_start() - time.monotonic())))
            while self.inbox.pending:
                name = self.inbox.pending.pop(0)
                getattr(self, f"handle_{name.lower()}")()
            self.reap_workers()
            next_kill = self.murder_workers()
            # The helpers are kept during a drain too: the draining children's
            # leases still need renewing.
            self.check_renewal()
            self.spawn_helpers()
            self.manage_workers()
            self._report()
            if self._stopping_done():
                break
        self._finish()
        return self._exit_code

    def _report(self) -> None:
        """Tell the world how supervision goes: title, gauges, the arbiter's
        liveness tick read by /healthz, and systemd's notify protocol."""
        now = time.monotonic()
        active = len([c for c in self.children.values() if not c.retiring])
        proctitle.set(self._title())
        metrics.WORKERS.set(self.table.workers_up(self.liveness))
        self.table.set_arbiter_state(now, self.target)
        if self._stopping:
            # systemd waits this long for the drain before its own KILL.
            self.systemd.stopping(max(0.0, self._drain_deadline - now) + 15,
                                  f"stopping ({self._stopping}), {active} workers")
            return
        up = self.table.workers_up(self.liveness)
        if up >= self.target:
            self.systemd.ready(f"{up} workers up, queues {','.join(self.settings.queues)}")
        # The watchdog is fed only while supervision is healthy: a live
        # renewal process that goes round its loop, and workers not in a
        # crash loop.
        healthy = self.renewal.pid is not None and self.restarts.boot_failures == 0 and \
            (self.renewal.signalled or self.helpers.renewal_silence(self.table, now) < self.renewal_stall)
        if healthy:
            self.systemd.watchdog(now)

    def _finish(self) -> None:
        """All children are gone: let the renewal process release what they
        held, then stop the helpers."""
        deadline = time.monotonic() + 10
        while self.table.orphans_left() and time.monotonic() < deadline:
            if self.renewal.gave_up:
                break   # it cannot start: the leases will run out instead
            self.spawn_helpers()
            self._wake_renewal()
            self._sleep(0.05)
            self.reap_workers()
        if self.table.orphans_left():
            log.error("could not release every job of the stopped workers; their leases will expire")
        self.helpers.retire_all(self._sleep, self.reap_workers)
        stats = self.table.renewal_stats()
        log.info("arbiter stopped: %d workers started, %d restarts, heartbeat %d rounds / %d renewal statements",
                 self.stats.spawned, self.stats.restarts, stats.rounds, stats.statements)

    def _sleep(self, seconds: float) -> None:
        self.inbox.sleep(seconds)

    def _title(self) -> str:
        n = len([c for c in self.children.values() if not c.retiring])
        state = f" {self._stopping} stop" if self._stopping else ""
        return f"pgfence arbiter [{n} workers] queues={','.join(self.settings.queues)}{state}"
