"""A worker child's life after the fork.

The child opens its own connection, claims, runs and completes jobs through
the fence (``pgfence.worker.engine.Engine``), and publishes what it holds and a
liveness tick in its slot of the shared table.  A small thread ticks (says
the child is alive) and copies what the renewal process wrote (new deadlines,
lost leases) into the child's leases; a child that is stopped or hung stops
ticking, so its leases stop being renewed.  The child always leaves with ``os._exit``, so it never
runs the parent's exit hooks nor closes the parent's file descriptors.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import sys
import threading

from pgfence.identity import worker_name
from pgfence.prefork import proctitle
from pgfence.job import JobBase
from pgfence.worker.lease import Lease
from pgfence.settings import Settings
from pgfence.prefork.slots import SlotTable

log = logging.getLogger("pgfence.worker")

#: Exit status of a child that could not start (the arbiter halts on it).
BOOT_ERROR = 3

#: Exit status of a child that replaced itself (``max_jobs_per_child``,
#: ``max_memory_per_child``): it finished its jobs and held none, so the
#: arbiter starts a fresh child in its place and counts no crash.
RECYCLED = 4

#: Signals the arbiter sends its children.  They are blocked across the fork
#: and unblocked by the child once its own handlers are set, so that one sent
#: a moment after the fork stays pending instead of reaching the arbiter's
#: handler copied into the child (where a TERM was lost) or the default action
#: (USR1 kills).
STARTUP_BLOCKED = frozenset({signal.SIGTERM, signal.SIGUSR1})


def recycle_limit(jobs: int, rng: random.Random | None = None) -> int:
    """This child's own job limit: ``jobs`` plus up to a tenth more, drawn
    at random, so that children started together are not all replaced at
    the same moment (each replacement is a fork, a connection and a cold
    start)."""
    return (rng or random.Random()).randint(jobs, jobs + jobs // 10)


def rss_mib() -> float:
    """The process's resident memory now, in MiB.

    From ``/proc/self/statm`` (its second field: resident pages): that is
    the current size, which falls again when memory is given back.
    ``resource.getrusage``'s ``ru_maxrss`` is the peak, which never falls; it
    is the fallback where there is no /proc, and there a child above its
    limit once stays above it, so it is replaced after its next job."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            resident = int(fh.read().split()[1])
        return resident * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Kilobytes on Linux, bytes on macOS.
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class SlotLeases:
    """What the worker tracks, published in its slot instead of renewed here."""

    def __init__(self, table: SlotTable, slot: int, tick_interval: float):
        self.table = table
        self.slot = slot
        self.tick_interval = tick_interval
        self._entries: dict[Lease, int] = {}
        # Free entries of the slot, so that tracking a lease is O(1) however
        # large the batch (a scan for a free entry made a batch O(n^2)).
        self._free = list(range(table.njobs - 1, -1, -1))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, lease: Lease) -> None:
        with self._lock:
            entry = self._free.pop()
            self._entries[lease] = entry
        self.table.publish(self.slot, entry, lease.id, lease.attempt, lease.seconds,
                           lease.claimed_at, lease.timeout, lease.started_at)

    def handler_started(self, lease: Lease) -> None:
        """Publish when the handler started: the renewal process and the
        arbiter count the job's timeout from it."""
        with self._lock:
            entry = self._entries.get(lease)
        if entry is not None and lease.started_at is not None:
            self.table.set_started(self.slot, entry, lease.started_at)

    def untrack(self, lease: Lease) -> None:
        with self._lock:
            entry = self._entries.pop(lease, None)
        if entry is not None:
            self.table.clear(self.slot, entry)
            with self._lock:
                self._free.append(entry)

    def sync(self) -> None:
        """Tick (the child is alive), and copy what the renewal process
        wrote into the leases held."""
        self.table.mark_alive(self.slot)
        with self._lock:
            items = list(self._entries.items())
        for lease, entry in items:
            renewal = self.table.read_renewal(self.slot, entry, lease.id, lease.attempt)
            if renewal is None:
                continue
            lease.failing = renewal.failing
            if renewal.lost:
                lease.mark_lost(renewal.lost)
            elif renewal.deadline:
                lease.extend(renewal.deadline)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_interval):
            self.sync()

    def start(self) -> None:
        self.sync()
        self._thread = threading.Thread(target=self._loop, name="pgfence-tick", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def main(number: int, slot: int, table: SlotTable, dsn: str, settings: Settings,
         tick_interval: float, instance: str) -> None:
    """Run the child until it is told to stop; never returns."""
    code = 0
    try:
        code = _run(number, slot, table, dsn, settings, tick_interval, instance)
    except BaseException as exc:  # noqa: BLE001 - the child must always reach os._exit
        log.error("worker %d crashed: %s: %s", number, type(exc).__name__, exc)
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _run(number: int, slot: int, table: SlotTable, dsn: str, settings: Settings,
         tick_interval: float, instance: str) -> int:
    from pgfence.observe import metrics
    from pgfence.worker.engine import make_worker

    parent = os.getppid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    proctitle.set(proctitle.worker(number, None))

    leases = SlotLeases(table, slot, tick_interval)
    last: list[tuple[str, int, int] | None] = [None]

    def titles(busy: int, capacity: int, job: JobBase | None) -> None:
        if job is not None:
            last[0] = (job.kind, job.id, job.attempt)
        elif not busy:
            last[0] = None
        proctitle.set(proctitle.worker(number, last[0], busy=busy, capacity=capacity))

    worker = make_worker(dsn, settings, name=worker_name(os.getpid(), number, instance),
                         heartbeat=leases, on_title=titles, recycle=True)
    titles(0, worker.capacity, None)
    # Signal handlers only record: the loop stops claiming and the running
    # job finishes first.
    signal.signal(signal.SIGTERM, lambda *_: worker.request_stop())
    # Should the arbiter die, even by SIGKILL, drain and leave like on TERM.
    proctitle.die_with_parent(parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_BLOCKED)
    # The first tick says the child is up: connected and ready to claim.  A
    # child that dies before it is counted as a failure to start.
    worker.connect_with_retry()
    leases.start()
    max_jobs = settings.max_jobs_per_child
    limit = recycle_limit(max_jobs) if max_jobs is not None else None
    max_memory = settings.max_memory_per_child
    grown: list[float] = []

    def too_big() -> bool:
        # Asked between jobs only: a child above its limit finishes the job
        # it holds and is then replaced.
        if max_memory is None:
            return False
        rss = rss_mib()
        if rss > max_memory:
            grown.append(rss)
            return True
        return False

    stats = worker.run(max_jobs=limit, enough=too_big)
    leases.stop()
    reason = getattr(worker, "recycle_reason", None)
    if worker.stopping and reason is None:
        return 0
    # run() returned without being asked to stop: a limit was reached, or a
    # handler outlived its lease, and the worker holds no job it could end.
    ran = stats.ran()
    if reason in ("timeout", "lost_lease"):
        metrics.CHILDREN_RECYCLED.labels(reason).inc()
        log.warning("worker %d recycled after %d jobs: a handler outlived its lease (%s) and was given up",
                    number, ran, reason)
        return RECYCLED
    metrics.CHILDREN_RECYCLED.labels("max_memory" if grown else "max_jobs").inc()
    if grown:
        log.info("worker %d recycled after %d jobs: resident memory %.0f MiB above max-memory-per-child %d MiB",
                 number, ran, grown[-1], max_memory)
    else:
        log.info("worker %d recycled after %d jobs (max-jobs-per-child %s, its own limit %s)",
                 number, ran, max_jobs, limit)
    return RECYCLED
