"""The arbiter: the parent process of ``pgfence run``.

It forks N worker children and two helper processes, the renewal process
(the heartbeat manager, which renews the children's leases) and the metrics
server; it reaps and respawns them, and acts on signals.  It holds no
database connection and runs no thread, so every fork is safe.  Signal handlers only record the signal; the
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

import gc
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
from enum import StrEnum

from prometheus_client import multiprocess

from pgfence import identity, registry
from pgfence.errors import ConfigError
from pgfence.observe import metrics
from pgfence.observe import server as metrics_server
from pgfence.scheduling.declared import declared, warn_unserved
from pgfence.prefork import child, proctitle
from pgfence.prefork.helper import MAX_BOOT_FAILURES, METRICS_UP_AFTER, HelperProcess, boot_backoff, kill
from pgfence.prefork.sdnotify import SystemdReporter
from pgfence.prefork.slots import ACTIVE, FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable
from pgfence.renewal import process as renewal_process
from pgfence.renewal.renewer import validate_heartbeat
from pgfence.settings import Settings

log = logging.getLogger("pgfence.arbiter")

SIGNALS = ("HUP", "INT", "QUIT", "TERM", "TTIN", "TTOU", "CHLD")

# MAX_BOOT_FAILURES (from helper.py) applies to workers too: this many
# children in a row dying before they were up (connected and ticking) and the
# arbiter halts instead of forking on.
__all__ = ["MAX_BOOT_FAILURES", "Arbiter", "Child", "Kill", "Stop"]

#: A child that was up and crashes within this many seconds of its start
#: extends the crash streak; one that lived longer starts a new streak.
CRASH_STREAK_WINDOW = 30.0
#: From the second crash of a streak, the next start waits 0.2 s, 0.4 s,
#: 0.8 s... up to this many seconds: a job or handler that kills every child
#: that touches it must not make the arbiter fork in a tight loop.
CRASH_BACKOFF_MAX = 30.0


def freeze_heap() -> None:
    """Move every object the arbiter holds now (the handler modules and what
    they imported) out of the collector's reach, before children are forked.

    A child's collector would otherwise walk these objects and rewrite
    their GC headers as it moves them between generations, so copy-on-write
    would copy every page that holds one into each child; frozen, they are
    never examined, and the pages only the collector would have touched stay
    shared (the refcounts of objects a child actually uses still copy their
    pages).  Called once the handler modules are imported, and
    again after a reload re-imports them.  The arbiter's own later garbage
    is still collected (only what exists at the call is frozen)."""
    gc.freeze()


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


class Arbiter:
    def __init__(self, dsn: str, settings: Settings, *,
                 reload_settings: Callable[[], Settings] | None = None,
                 metrics_sock: socket.socket | None = None):
        #: Bound by the caller before any fork; served by the metrics child.
        self.metrics_sock = metrics_sock
        self.systemd = SystemdReporter()
        validate_heartbeat(settings.heartbeat, registry.specs())
        warn_unserved(declared(settings))   # a schedule declared twice is refused here, at start
        self.dsn = dsn
        self.settings = settings
        #: In every child's name: tells this supervisor's children from
        #: another's with the same host name and pids (see identity.new_instance_id).
        self.instance = identity.new_instance_id()
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
                                                 detail=self._metrics_url)
        # A renewal round may take a statement timeout (one interval) plus a
        # pool wait (at least 1 s); silence well beyond that is a stall.
        self.renewal_stall = 3 * settings.heartbeat_interval + 5.0
        self.stats = ArbiterStats()
        self._signals: list[str] = []
        self._next_number = 1
        self._boot_failures = 0
        # Children in a row that crashed soon after they were up.
        self._crash_streak = 0
        self._respawn_at = 0.0
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
        # Schedules declared in code are declared again by the modules' new
        # import: one removed from them must enqueue nothing more.  If the
        # reload fails, the running ones stay.
        schedules = registry.schedules()
        registry.forget_schedules()
        try:
            self._reload()
        except BaseException:
            registry.forget_schedules()
            for schedule in schedules:
                registry.periodic(schedule.name, schedule.kind, cron=schedule.cron, every=schedule.every,
                                  tz=schedule.tz, payload=schedule.payload, queue=schedule.queue,
                                  overlap=schedule.overlap, catch_up=schedule.catch_up,
                                  catch_up_window=schedule.catch_up_window)
            raise

    def _reload(self) -> None:
        for name in self.settings.handlers:
            module = sys.modules.get(name)
            try:
                if module is not None:
                    importlib.reload(module)
                else:
                    registry.load([name])
            except ConfigError as exc:
                raise ConfigError(f"cannot re-import handler module {name!r}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - any import error
                raise ConfigError(f"cannot re-import handler module {name!r}: {type(exc).__name__}: {exc}") from None
        settings = self.settings
        if self.reload_settings is not None:
            settings = self.reload_settings()
            registry.load(settings.handlers)
            validate_heartbeat(settings.heartbeat, registry.specs())
        warn_unserved(declared(settings))
        if self.reload_settings is not None:
            # The table was sized at start: a reload cannot grow what a
            # child may hold beyond it.
            njobs = self.table.njobs
            with_async = registry.has_async()
            # (twice the capacity: a job ended but not yet completed keeps
            # its entry while its slot takes another).
            most = njobs // 2
            if settings.claim_size(with_async) > njobs or settings.capacity(with_async) > most:
                log.warning("reload: threads and async-concurrency are capped at %d jobs per worker and batch at "
                            "%d, the sizes set at start; restart pgfence to raise them", most, njobs)
                threads = min(settings.threads, most)
                settings = settings.replace(
                    batch=None if settings.batch is None else min(settings.batch, njobs), threads=threads,
                    async_concurrency=max(1, min(settings.async_concurrency, most - threads)))
            self.settings = settings
            self.target = settings.workers
        # The re-imported modules are the new children's shared pages.
        freeze_heap()

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

    def _fork_helper(self, name: str, main: Callable[[], int]) -> int:
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
        self.systemd.close()
        # Only the arbiter speaks to systemd (NotifyAccess=main).
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(name, None)

    def _start_metrics(self) -> int:
        sock = self.metrics_sock
        assert sock is not None, "a metrics server needs the socket bound for it"

        def main() -> int:
            self._close_inherited(keep_metrics=True)
            return metrics_server.main(sock, self.dsn, self.table, self.liveness, self.settings)

        return self._fork_helper("metrics server", main)

    def _metrics_url(self) -> str:
        if self.metrics_sock is None:
            return ""
        host, port = self.metrics_sock.getsockname()[:2]
        return f" on http://{host}:{port}/metrics"

    def _start_renewal(self) -> int:
        def main() -> int:
            self._close_inherited()
            # Looked up at each start (not imported by name), so that a
            # handler module loaded before the fork may replace it in tests.
            return renewal_process.main(self.dsn, self.settings, self.table, self.liveness, self.instance,
                                        self.started)

        return self._fork_helper("heartbeat manager", main)

    def spawn_helpers(self) -> None:
        """Start each helper process that is due: not running, past its
        backoff, not given up on."""
        now = time.monotonic()
        for helper in self._helpers():
            if helper.due(now):
                helper.spawn()

    def _helpers(self) -> list[HelperProcess]:
        return [self.renewal] + ([self.metrics_process] if self.metrics_process is not None else [])

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
            helper = next((h for h in self._helpers() if h.pid == pid), None)
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
        held = self.table.held(c.slot)
        # The child ticked at least once: it connected and was ready to work.
        booted = self.table.slot(c.slot).alive_at > 0
        code = os.waitstatus_to_exitcode(status)
        # A child that replaced itself after its job or memory limit left as
        # cleanly as one asked to go: a fresh one takes its place, and it is
        # no crash (no restart counted, no crash streak, no boot failure).
        recycled = code == child.RECYCLED
        planned = c.retiring or self._stopping or recycled
        clean = code == 0 or recycled
        level = logging.INFO if planned and clean else logging.WARNING
        if recycled:
            how = "recycled: starting a fresh worker in its place"
            self.stats.recycled += 1
        log.log(level, "worker %d (pid %d) %s%s", c.number, c.pid, how,
                f" holding {len(held)} job(s): releasing them" if held else "")
        # A child that was up and did not exit cleanly may also hold a claim
        # it had no time to publish: the heartbeat manager looks for those by
        # name.  One that never came up (never ticked) never claimed.
        if held or (booted and not clean):
            stop_kill = c.killed in (Kill.STOP, Kill.OUTAGE) or self._stopping is not None
            self.table.set_state(c.slot, ORPHANED_STOP if stop_kill else ORPHANED_CRASH)
            self._wake_renewal()
        else:
            self.table.clear_all(c.slot)
            self.table.set_state(c.slot, FREE)
        if code == child.BOOT_ERROR:
            self._halt(f"worker {c.number} could not start (exit {code}); stopping")
            return
        if not planned:
            self.stats.restarts += 1
            metrics.WORKER_RESTARTS.inc()
            if not booted:
                self._boot_failures += 1
                if self._boot_failures >= MAX_BOOT_FAILURES:
                    self._halt(f"workers keep dying at start ({self._boot_failures} in a row, last {how}); stopping")
                    return
                self._respawn_at = time.monotonic() + boot_backoff(self._boot_failures)
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
        next_kill = float("inf")
        for c in list(self.children.values()):
            if self._stopping and now >= self._drain_deadline:
                if c.killed is not Kill.STOP:
                    c.killed = Kill.STOP
                    if self._stopping is Stop.GRACEFUL:
                        log.warning("worker %d (pid %d) still busy at the drain deadline: killing it",
                                    c.number, c.pid)
                    else:
                        log.info("killing worker %d (pid %d)", c.number, c.pid)
                    kill(c.pid, signal.SIGKILL)
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
                        c.killed = Kill.LOST
                        log.warning("worker %d (pid %d) still runs job %d attempt %d %gs after its timeout "
                                    "(%gs): killing it", c.number, c.pid, held.job_id, held.attempt, grace,
                                    held.timeout)
                        kill(c.pid, signal.SIGKILL)
                        break
                    next_kill = min(next_kill, kill_at)
                renewal = self.table.read_renewal(c.slot, held.entry, held.job_id, held.attempt)
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

    def _renewal_silence(self, now: float) -> float:
        """Seconds since the running renewal process last went round its
        loop (since its start, before its first round)."""
        stats = self.table.renewal_stats()
        last = stats.alive_at if stats.pid == self.renewal.pid else self.renewal.started
        return now - max(last, self.renewal.started)

    def check_renewal(self) -> None:
        """Kill a renewal process that stopped going round its loop (a
        renewal stuck on a network that drops packets); the loop starts a new
        one.  Children stay safe meanwhile: each gives up its leases at their
        own deadline."""
        if self.renewal.pid is None or self.renewal.signalled:
            return
        silence = self._renewal_silence(time.monotonic())
        if silence > self.renewal_stall:
            log.warning("heartbeat manager (pid %d) stalled for %.0fs: killing it", self.renewal.pid, silence)
            self.renewal.kill(signal.SIGKILL)

    def manage_workers(self) -> None:
        if self._stopping:
            return
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
        return any(self.table.slot(s).state in (ORPHANED_CRASH, ORPHANED_STOP) for s in range(self.table.nslots))

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        metrics.initialise(self.settings.queues, registry.kinds())
        self._install_signals()
        proctitle.set(self._title())
        self.table.set_arbiter_state(time.monotonic(), self.target)
        freeze_heap()
        self.spawn_helpers()
        self.manage_workers()
        proctitle.set(self._title())
        log.info("arbiter started: %d workers on queues %s (instance %s)", self.target,
                 ",".join(self.settings.queues), self.instance)
        next_kill = float("inf")
        while True:
            self._sleep(max(0.0, min(0.1 if self._stopping else 0.5, next_kill - time.monotonic(),
                                     self._next_start() - time.monotonic())))
            while self._signals:
                name = self._signals.pop(0)
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

    def _next_start(self) -> float:
        """When the next helper process is due to start (monotonic; ``inf``
        if none waits), so the loop wakes for it rather than a turn later."""
        waiting = [h.respawn_at for h in self._helpers() if h.pid is None and not h.retired and not h.gave_up]
        return min(waiting, default=float("inf"))

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
        healthy = self.renewal.pid is not None and self._boot_failures == 0 and \
            (self.renewal.signalled or self._renewal_silence(now) < self.renewal_stall)
        if healthy:
            self.systemd.watchdog(now)

    def _finish(self) -> None:
        """All children are gone: let the renewal process release what they
        held, then stop the helpers."""
        deadline = time.monotonic() + 10
        while self._orphans_left() and time.monotonic() < deadline:
            if self.renewal.gave_up:
                break   # it cannot start: the leases will run out instead
            self.spawn_helpers()
            self._wake_renewal()
            self._sleep(0.05)
            self.reap_workers()
        if self._orphans_left():
            log.error("could not release every job of the stopped workers; their leases will expire")
        helpers = self._helpers()
        for helper in helpers:
            helper.retire()
        end = time.monotonic() + 5
        while any(h.pid is not None for h in helpers) and time.monotonic() < end:
            self._sleep(0.05)
            self.reap_workers()
        for helper in helpers:
            helper.kill(signal.SIGKILL)
        stats = self.table.renewal_stats()
        log.info("arbiter stopped: %d workers started, %d restarts, heartbeat %d rounds / %d renewal statements",
                 self.stats.spawned, self.stats.restarts, stats.rounds, stats.statements)

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



def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
