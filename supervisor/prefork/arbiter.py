"""The arbiter: the parent process of ``pgfence run``.

It forks N worker children and one heartbeat manager, reaps and respawns
them, and acts on signals.  It holds no database connection and runs no
thread, so every fork is safe.  Signal handlers only record the signal; the
main loop dispatches it by name to a ``handle_<name>`` method.

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

import errno
import importlib
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import multiprocess

from pgfence.prefork import child
from pgfence.renewal import process as heartbeat_process
from pgfence.observe import metrics
from pgfence.observe import server as metrics_server
from pgfence.prefork import proctitle
from pgfence import registry
from pgfence.renewal.renewer import validate_heartbeat
from pgfence.prefork.sdnotify import Notifier
from pgfence.errors import ConfigError
from pgfence.settings import Settings
from pgfence.prefork.slots import ACTIVE, FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable

log = logging.getLogger("pgfence.arbiter")

SIGNALS = ("HUP", "INT", "QUIT", "TERM", "TTIN", "TTOU", "CHLD")

#: This many children in a row dying before they were up (connected and
#: ticking) and the arbiter halts instead of forking on.
MAX_BOOT_FAILURES = 5
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


@dataclass
class Child:
    pid: int
    number: int
    slot: int
    started: float
    #: Set when the arbiter asked it to go (TERM) or killed it (KILL).
    retiring: bool = False
    killed_for_stop: bool = False
    term_sent_at: float | None = None
    killed_for_lost: bool = False
    #: Killed because a lease it held was lost to a renewal that failed (the
    #: database out of reach): its jobs are released without counting
    #: against their max_reclaims.
    killed_for_outage: bool = False
    #: The child ticked at least once: it connected and was ready to work.
    booted: bool = False


@dataclass
class ArbiterStats:
    spawned: int = 0
    restarts: int = 0


class Arbiter:
    def __init__(self, dsn: str, settings: Settings, *,
                 reload_settings: Callable[[], Settings] | None = None,
                 metrics_sock: socket.socket | None = None):
        #: Bound by the caller before any fork; served by the metrics child.
        self.metrics_sock = metrics_sock
        self.metrics_pid: int | None = None
        self.notifier = Notifier()
        self._ready_sent = False
        self._stopping_sent = False
        self._last_watchdog = 0.0
        validate_heartbeat(settings.heartbeat, registry.specs())
        self.dsn = dsn
        self.settings = settings
        #: In every child's name: tells this supervisor's children from
        #: another's with the same host name and pids (see child.new_instance_id).
        self.instance = child.new_instance_id()
        self.reload_settings = reload_settings
        self.target = settings.workers
        self.children: dict[int, Child] = {}
        self.heartbeat_pid: int | None = None
        self._heartbeat_started: float | None = None
        self._heartbeat_stopping = False
        self._heartbeat_reloading = False
        # Heartbeat managers in a row that died before their first round.
        self._heartbeat_failures = 0
        self._heartbeat_respawn_at = 0.0
        # A heartbeat round may take a statement timeout (one interval) plus a
        # pool wait (at least 1 s); silence well beyond that is a stall.
        self.heartbeat_stall = 3 * settings.heartbeat_interval + 5.0
        self.stats = ArbiterStats()
        self._signals: list[str] = []
        self._next_number = 1
        self._boot_failures = 0
        # Children in a row that crashed soon after they were up.
        self._crash_streak = 0
        self._respawn_at = 0.0
        self._stopping: str | None = None     # None, "graceful" or "fast"
        self._drain_deadline = 0.0
        self._exit_code = 0
        self.tick_interval = max(0.02, min(0.25, settings.heartbeat_interval / 4))
        # A child that has not ticked for this long gets no renewals.
        self.liveness = max(1.0, 4 * self.tick_interval)
        self.table = SlotTable(nslots=max(256, 4 * settings.workers), njobs=max(16, settings.batch))

    # -- signals -----------------------------------------------------------------

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        for name in SIGNALS:
            signal.signal(getattr(signal, f"SIG{name}"), self._record)

    def _record(self, signum: int, _frame: object) -> None:
        # Record only: the loop acts.
        self._signals.append(signal.Signals(signum).name[3:])

    def handle_term(self) -> None:
        if self._stopping:
            log.info("second stop signal: not waiting for the drain")
            self._drain_deadline = time.monotonic()
            return
        log.info("SIGTERM: draining %d workers (graceful timeout %gs)", len(self.children),
                 self.settings.graceful_timeout)
        self._stopping = "graceful"
        self._drain_deadline = time.monotonic() + self.settings.graceful_timeout
        for c in self.children.values():
            self._term(c)

    def handle_int(self) -> None:
        if self._stopping == "graceful":
            self._drain_deadline = time.monotonic()
            return
        log.info("fast stop: killing %d workers and releasing their jobs", len(self.children))
        self._stopping = "fast"
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
        # The heartbeat manager takes the new settings too: stop it, and the
        # loop starts a new one at once (well within a renewal interval).
        if self.heartbeat_pid:
            self._heartbeat_reloading = True
            _kill(self.heartbeat_pid, signal.SIGTERM)

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
        for name in self.settings.handlers:
            module = sys.modules.get(name)
            try:
                if module is not None:
                    importlib.reload(module)
                else:
                    registry.load([name])
            except Exception as exc:  # noqa: BLE001 - any import error
                raise ConfigError(f"cannot re-import handler module {name!r}: {type(exc).__name__}: {exc}") from None
        if self.reload_settings is not None:
            settings = self.reload_settings()
            registry.load(settings.handlers)
            validate_heartbeat(settings.heartbeat, registry.specs())
            self.settings = settings.replace(batch=min(settings.batch, self.table.njobs))
            self.target = settings.workers

    def _fork(self) -> int:
        # The arbiter runs no thread, so nothing another thread holds can be
        # copied locked into the child.
        assert threading.active_count() == 1, "the arbiter must fork with one thread"
        sys.stdout.flush()
        sys.stderr.flush()
        # See child.STARTUP_BLOCKED: the child unblocks them once it is ready.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, child.STARTUP_BLOCKED)
        pid = -1
        try:
            pid = os.fork()
            return pid
        finally:
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def spawn_worker(self) -> Child | None:
        slot = self.table.free_slot()
        if slot is None:
            log.error("no free worker slot; not starting another worker")
            return None
        number = self._next_number
        self._next_number += 1
        self.table.clear_all(slot)
        self.table.set_slot(slot, ACTIVE, 0, number)
        pid = self._fork()
        if pid == 0:
            self._close_inherited()
            child.main(number, slot, self.table, self.dsn, self.settings, self.tick_interval, self.instance)
        self.table.set_slot(slot, ACTIVE, pid, number)
        c = self.children[pid] = Child(pid, number, slot, time.monotonic())
        self.stats.spawned += 1
        log.info("worker %d started (pid %d)", number, pid)
        return c

    def _fork_service(self, name: str, main: Callable[[], int]) -> int:
        """Fork a helper process (heartbeat manager, metrics server) that runs
        ``main`` and leaves with ``os._exit``, never returning here."""
        pid = self._fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                code = main()
            except BaseException as exc:  # noqa: BLE001 - must reach os._exit
                log.error("%s crashed: %s: %s", name, type(exc).__name__, exc)
            finally:
                logging.shutdown()
                os._exit(code)
        return pid

    def _close_inherited(self, *, keep_metrics: bool = False) -> None:
        """In a child: drop what only the arbiter (and the metrics server)
        needs."""
        if self.metrics_sock is not None and not keep_metrics:
            self.metrics_sock.close()
        self.notifier.close()
        # Only the arbiter speaks to systemd (NotifyAccess=main).
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(name, None)

    def spawn_metrics(self) -> None:
        if self.metrics_sock is None:
            return
        def main() -> int:
            self._close_inherited(keep_metrics=True)
            return metrics_server.main(self.metrics_sock, self.dsn, self.table, self.liveness)

        self.metrics_pid = self._fork_service("metrics server", main)
        log.info("metrics server started (pid %d) on http://%s:%d/metrics", self.metrics_pid,
                 *self.metrics_sock.getsockname()[:2])

    def spawn_heartbeat(self) -> None:
        def main() -> int:
            self._close_inherited()
            return heartbeat_process.main(self.dsn, self.settings, self.table, self.liveness, self.instance)

        pid = self._fork_service("heartbeat manager", main)
        self.heartbeat_pid = pid
        self._heartbeat_started = time.monotonic()
        log.info("heartbeat manager started (pid %d)", pid)

    def reap_workers(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            how = _describe(status)
            # Its live gauges go with it; its counters stay in the sums.
            multiprocess.mark_process_dead(pid)
            if pid == self.metrics_pid:
                self.metrics_pid = None
                if not self._heartbeat_stopping:
                    log.warning("metrics server %s; restarting it", how)
                continue
            if pid == self.heartbeat_pid:
                self.heartbeat_pid = None
                if not self._heartbeat_stopping:
                    self._heartbeat_exited(pid, how)
                continue
            c = self.children.pop(pid, None)
            if c is None:
                continue
            self._child_exited(c, status, how)

    def _heartbeat_exited(self, pid: int, how: str) -> None:
        """Restart the heartbeat manager; one that died before its first round
        (its pid never reached the table's header) is restarted with backoff,
        and after MAX_BOOT_FAILURES in a row the arbiter halts, as for workers,
        instead of forking in a tight loop."""
        if self.table.header()[2] == pid:
            self._heartbeat_failures = 0
            if self._heartbeat_reloading:
                log.info("heartbeat manager stopped for the reload; starting a new one")
            else:
                log.warning("heartbeat manager %s; restarting it", how)
            self._heartbeat_reloading = False
            self.spawn_heartbeat()
            return
        self._heartbeat_failures += 1
        delay = min(10.0, 0.1 * 2 ** self._heartbeat_failures)
        self._heartbeat_respawn_at = time.monotonic() + delay
        if self._heartbeat_failures >= MAX_BOOT_FAILURES and not self._stopping:
            self._halt(f"the heartbeat manager keeps dying at start ({self._heartbeat_failures} in a row, "
                       f"last {how}); stopping")
            return
        log.warning("heartbeat manager %s before it was up; restarting it in %.1fs", how, delay)

    def _child_exited(self, c: Child, status: int, how: str) -> None:
        held = self.table.held(c.slot)
        c.booted = self.table.slot(c.slot)[3] > 0
        planned = c.retiring or self._stopping
        level = logging.INFO if planned and os.waitstatus_to_exitcode(status) == 0 else logging.WARNING
        log.log(level, "worker %d (pid %d) %s%s", c.number, c.pid, how,
                f" holding {len(held)} job(s): releasing them" if held else "")
        # A child that was up and did not exit cleanly may also hold a claim
        # it had no time to publish: the heartbeat manager looks for those by
        # name.  One that never came up (never ticked) never claimed.
        if held or (c.booted and os.waitstatus_to_exitcode(status) != 0):
            stop_kill = c.killed_for_stop or c.killed_for_outage or self._stopping is not None
            self.table.set_state(c.slot, ORPHANED_STOP if stop_kill else ORPHANED_CRASH)
            self._wake_heartbeat()
        else:
            self.table.clear_all(c.slot)
            self.table.set_state(c.slot, FREE)
        code = os.waitstatus_to_exitcode(status)
        if code == child.BOOT_ERROR:
            self._halt(f"worker {c.number} could not start (exit {code}); stopping")
            return
        if not planned:
            self.stats.restarts += 1
            metrics.WORKER_RESTARTS.inc()
            if not c.booted:
                self._boot_failures += 1
                if self._boot_failures >= MAX_BOOT_FAILURES:
                    self._halt(f"workers keep dying at start ({self._boot_failures} in a row, last {how}); stopping")
                    return
                self._respawn_at = time.monotonic() + min(10.0, 0.1 * 2 ** self._boot_failures)
            else:
                self._boot_failures = 0
                self._crashed_after_boot(c, code, holding=bool(held))

    def _crashed_after_boot(self, c: Child, code: int, *, holding: bool) -> None:
        """Delay the next start when children keep crashing in the middle of
        a job soon after they were up (a job whose handler kills its worker
        would otherwise crash one child after another at once),
        exponentially and capped.  A child that lived a healthy while, left
        cleanly, or died idle (killed from outside between jobs: it did its
        work) resets the streak."""
        lived = time.monotonic() - c.started
        if code == 0 or c.killed_for_lost or not holding:
            self._crash_streak = 0
            return
        self._crash_streak = self._crash_streak + 1 if lived < CRASH_STREAK_WINDOW else 1
        delay = crash_backoff(self._crash_streak)
        if delay:
            self._respawn_at = max(self._respawn_at, time.monotonic() + delay)
            log.warning("worker %d crashed %d times in a row, each within %gs of its start: next start in %.1fs",
                        c.number, self._crash_streak, CRASH_STREAK_WINDOW, delay)

    def _halt(self, message: str) -> None:
        log.error(message)
        print(f"pgfence: error: {message}", file=sys.stderr)
        self._exit_code = 1
        if not self._stopping:
            self._stopping = "fast"
            self._drain_deadline = time.monotonic()

    def _wake_heartbeat(self) -> None:
        if self.heartbeat_pid:
            _kill(self.heartbeat_pid, signal.SIGUSR1)

    def _term(self, c: Child) -> None:
        c.retiring = True
        if c.term_sent_at is None:
            c.term_sent_at = time.monotonic()
            _kill(c.pid, signal.SIGTERM)

    def murder_workers(self) -> float:
        """Kill children past their time: a job past its timeout by the grace
        period, a job whose lease is lost beyond the grace period, a drain
        past its deadline.  Returns when the next such kill falls due
        (monotonic; ``inf`` if none)."""
        now = time.monotonic()
        grace = self.settings.lost_lease_kill_after
        next_kill = float("inf")
        for c in list(self.children.values()):
            if self._stopping and now >= self._drain_deadline:
                if not c.killed_for_stop:
                    c.killed_for_stop = True
                    if self._stopping == "graceful":
                        log.warning("worker %d (pid %d) still busy at the drain deadline: killing it",
                                    c.number, c.pid)
                    else:
                        log.info("killing worker %d (pid %d)", c.number, c.pid)
                    _kill(c.pid, signal.SIGKILL)
                continue
            if c.killed_for_lost:
                continue   # SIGKILL sent; waiting for waitpid
            for held in self.table.held(c.slot):
                # A timeout is a hard limit: the child was told at the timeout
                # (its lease marked lost, while the job stays held), and is
                # killed the grace period after it, whether it ticks or not;
                # its job is then released at once as a timed-out attempt.
                if held.timeout is not None and held.started_at is not None:
                    kill_at = held.started_at + held.timeout + grace
                    if now >= kill_at:
                        c.killed_for_lost = True
                        log.warning("worker %d (pid %d) still runs job %d attempt %d %gs after its timeout "
                                    "(%gs): killing it", c.number, c.pid, held.job_id, held.attempt, grace,
                                    held.timeout)
                        _kill(c.pid, signal.SIGKILL)
                        break
                    next_kill = min(next_kill, kill_at)
                news = self.table.news(c.slot, held.entry, held.job_id, held.attempt)
                if news and news[1] and news[1] != "timeout":
                    if now - news[2] >= grace:
                        c.killed_for_lost = True
                        # An outage lost the lease, not the job or its worker.
                        c.killed_for_outage = news[1] == "renewal_failed"
                        log.warning("worker %d (pid %d) still runs job %d attempt %d %gs after its lease was lost "
                                    "(%s): killing it", c.number, c.pid, held.job_id, held.attempt, grace, news[1])
                        _kill(c.pid, signal.SIGKILL)
                        break
                    next_kill = min(next_kill, news[2] + grace)
        return next_kill

    def check_heartbeat(self) -> None:
        """Kill a heartbeat manager that stopped ticking (a renewal stuck on a
        network that drops packets); the loop starts a new one.  Children
        stay safe meanwhile: each gives up its leases at their own deadline."""
        if self.heartbeat_pid is None or self._heartbeat_started is None:
            return
        _rounds, _statements, pid, tick = self.table.header()
        last = tick if pid == self.heartbeat_pid else self._heartbeat_started
        if time.monotonic() - max(last, self._heartbeat_started) > self.heartbeat_stall:
            log.warning("heartbeat manager (pid %d) stalled for %.0fs: killing it", self.heartbeat_pid,
                        time.monotonic() - max(last, self._heartbeat_started))
            _kill(self.heartbeat_pid, signal.SIGKILL)
            self._heartbeat_started = None

    def manage_workers(self) -> None:
        if self._stopping:
            return
        if self.metrics_pid is None and self.metrics_sock is not None:
            self.spawn_metrics()
        self.check_heartbeat()
        if self.heartbeat_pid is None and time.monotonic() >= self._heartbeat_respawn_at:
            self.spawn_heartbeat()
        active = [c for c in self.children.values() if not c.retiring]
        if len(active) < self.target and time.monotonic() >= self._respawn_at:
            for _ in range(self.target - len(active)):
                if self.spawn_worker() is None:
                    break
        elif len(active) > self.target:
            for c in sorted(active, key=lambda c: c.started)[: len(active) - self.target]:
                self._term(c)

    def _stopping_done(self) -> bool:
        return self._stopping is not None and not self.children

    def _orphans_left(self) -> bool:
        return any(self.table.slot(s)[0] in (ORPHANED_CRASH, ORPHANED_STOP) for s in range(self.table.nslots))

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        metrics.initialise(self.settings.queues, registry.kinds())
        self._install_signals()
        proctitle.set(self._title())
        self.table.set_arbiter(time.monotonic(), self.target)
        self.spawn_heartbeat()
        self.spawn_metrics()
        self.manage_workers()
        proctitle.set(self._title())
        log.info("arbiter started: %d workers on queues %s (instance %s)", self.target,
                 ",".join(self.settings.queues), self.instance)
        next_kill = float("inf")
        while True:
            self._sleep(max(0.0, min(0.1 if self._stopping else 0.5, next_kill - time.monotonic())))
            while self._signals:
                name = self._signals.pop(0)
                getattr(self, f"handle_{name.lower()}")()
            self.reap_workers()
            next_kill = self.murder_workers()
            self.manage_workers()
            self._report()
            if self._stopping_done():
                break
        self._finish()
        return self._exit_code

    def _report(self) -> None:
        """Tell the world how supervision goes: title, gauges, the liveness
        tick read by /healthz, and systemd's notify protocol."""
        now = time.monotonic()
        active = len([c for c in self.children.values() if not c.retiring])
        proctitle.set(self._title())
        metrics.WORKERS.set(self.table.workers_up(self.liveness))
        self.table.set_arbiter(now, self.target)
        if self._stopping:
            if not self._stopping_sent:
                self._stopping_sent = True
                # systemd waits this long for the drain before its own KILL.
                extend = int((max(0.0, self._drain_deadline - now) + 15) * 1e6)
                self.notifier.send("STOPPING=1", f"EXTEND_TIMEOUT_USEC={extend}",
                                   f"STATUS=stopping ({self._stopping}), {active} workers")
            return
        up = self.table.workers_up(self.liveness)
        if not self._ready_sent and up >= self.target:
            self._ready_sent = True
            self.notifier.send("READY=1", f"STATUS={up} workers up, queues {','.join(self.settings.queues)}")
        # The watchdog is fed only while supervision is healthy: a live
        # heartbeat manager that ticks, and workers not in a crash loop.
        healthy = self.heartbeat_pid is not None and self._boot_failures == 0 and \
            (self._heartbeat_started is None or now - self._heartbeat_started < self.heartbeat_stall
             or now - self.table.header()[3] < self.heartbeat_stall)
        if healthy and self._ready_sent and now - self._last_watchdog >= 1.0:
            self._last_watchdog = now
            self.notifier.send("WATCHDOG=1")

    def _finish(self) -> None:
        """All children are gone: let the heartbeat release what they held,
        then stop it."""
        deadline = time.monotonic() + 10
        while self._orphans_left() and time.monotonic() < deadline:
            if self._heartbeat_failures >= MAX_BOOT_FAILURES:
                break   # it cannot start: the leases will run out instead
            if self.heartbeat_pid is None and time.monotonic() >= self._heartbeat_respawn_at:
                self.spawn_heartbeat()
            self._wake_heartbeat()
            self._sleep(0.05)
            self.reap_workers()
        if self._orphans_left():
            log.error("could not release every job of the stopped workers; their leases will expire")
        self._heartbeat_stopping = True
        if self.metrics_pid:
            _kill(self.metrics_pid, signal.SIGTERM)
        if self.heartbeat_pid:
            _kill(self.heartbeat_pid, signal.SIGTERM)
            end = time.monotonic() + 5
            while (self.heartbeat_pid or self.metrics_pid) and time.monotonic() < end:
                self._sleep(0.05)
                self.reap_workers()
            if self.heartbeat_pid:
                _kill(self.heartbeat_pid, signal.SIGKILL)
        rounds, statements, _pid, _tick = self.table.header()
        log.info("arbiter stopped: %d workers started, %d restarts, heartbeat %d rounds / %d renewal statements",
                 self.stats.spawned, self.stats.restarts, rounds, statements)

    def _sleep(self, seconds: float) -> None:
        try:
            ready, _, _ = select.select([self._wake_r], [], [], seconds)
        except InterruptedError:
            return
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def _title(self) -> str:
        n = len([c for c in self.children.values() if not c.retiring])
        state = f" {self._stopping} stop" if self._stopping else ""
        return f"pgfence arbiter [{n} workers] queues={','.join(self.settings.queues)}{state}"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
