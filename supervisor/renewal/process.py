"""The heartbeat manager as a process of its own, for all children.

Forked by the arbiter, it opens its ``psycopg_pool`` pool after the fork.
Each round it reads the shared slot table, renews in ONE statement the
leases due (see :mod:`pgfence.renewal.renewer`) of every job held by a
child that has ticked recently (its liveness tick: the child runs), and
writes back per job the new local deadline or
the reason the lease was lost.  Rounds follow the leases held: a kind with a
short lease is renewed at its own pace, and a job's timeout is reported to
its child the moment it passes.  A child
that is stopped, hung or dead does not tick, so its jobs are not renewed and
their leases run out as they should.  Jobs of children that died are
released here, fenced, as soon as the arbiter reports the death (SIGUSR1).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time

from pgfence.observe import metrics
from pgfence.prefork import proctitle
from pgfence import registry
from pgfence.backoff import Backoff
from pgfence.scheduling.declared import declared
from pgfence.scheduling.scheduler import Scheduler
from pgfence.renewal.presence import Presence, arbiter_started_at
from pgfence.renewal.renewer import HeartbeatManager, renew_period
from pgfence.worker.lease import Lease
from pgfence.worker.kinds import KindsRecord
from pgfence.worker.vacuum import SelfVacuum
from pgfence.identity import supervisor_name, worker_name
from pgfence.settings import Settings
from pgfence.prefork.slots import ACTIVE, FREE, ORPHANED_CRASH, ORPHANED_STOP, SlotTable

log = logging.getLogger("pgfence.heartbeat")

#: Where a held lease sits: (slot, entry, job id, attempt).
Key = tuple[int, int, int, int]


class RenewalProcess:
    """The heartbeat manager's process: lease renewal for every child,
    driven by the slot table."""

    def __init__(self, dsn: str, settings: Settings, table: SlotTable, *, liveness: float, instance: str) -> None:
        self.table = table
        #: The supervisor's instance id, in its children's names.
        self.instance = instance
        self.liveness = liveness
        self.manager = HeartbeatManager(dsn, default_lease=settings.lease, interval=settings.heartbeat,
                                        timeout_grace=settings.lost_lease_kill_after, prepare=settings.prepare,
                                        idle_in_transaction_timeout=settings.idle_in_transaction_timeout,
                                        backoff=Backoff(settings.backoff_base, settings.backoff_max))
        # How long the loop may sleep without looking at the table: short
        # enough to renew the shortest lease of the kinds registered (the
        # arbiter loaded them before the fork) and to catch their timeouts.
        spans = [renew_period(spec.lease, settings.heartbeat) / 2 for spec in registry.specs() if spec.lease]
        spans += [timeout / 4 for timeout in [settings.timeout] + [spec.timeout for spec in registry.specs()]
                  if timeout]
        self.wake = max(0.02, min([0.5, renew_period(settings.lease, settings.heartbeat) / 2, *spans]))
        # The manager's own view of each held lease, keyed by (slot, entry,
        # job id, attempt); rebuilt from the slot table every round.
        self._leases: dict[Key, Lease] = {}
        self.rounds = 0

    def held_leases(self, now: float) -> tuple[list[Lease], list[Key]]:
        """Leases of live children (to renew) and the keys they sit at."""
        seen: set[Key] = set()
        renew: list[Lease] = []
        keys: list[Key] = []
        for slot in range(self.table.nslots):
            info = self.table.slot(slot)
            if info.state != ACTIVE:
                continue
            alive = now - info.alive_at <= self.liveness
            for held in self.table.held(slot):
                key = (slot, held.entry, held.job_id, held.attempt)
                seen.add(key)
                lease = self._leases.get(key)
                if lease is None:
                    # A manager that replaces another one (killed, or stopped
                    # on HUP) takes over the deadline and loss last reported
                    # for this very job and attempt: counted from the claim
                    # alone, every job that outlived its first lease would be
                    # taken for expired and given up.
                    deadline, lost, lost_at, failing = held.claimed_at + held.lease, None, 0.0, False
                    last = self.table.read_renewal(slot, held.entry, held.job_id, held.attempt)
                    if last is not None:
                        deadline, lost, lost_at, failing = (max(deadline, last.deadline), last.lost, last.lost_at,
                                                            last.failing)
                    lease = self._leases[key] = Lease(
                        held.job_id, held.attempt, held.lease, deadline=deadline,
                        claimed_at=held.claimed_at, started_at=held.started_at, timeout=held.timeout,
                        count=False, lost_reason=lost, lost_at=lost_at if lost else 0.0, failing=failing)
                elif lease.started_at is None:
                    lease.started_at = held.started_at   # the handler started since the last round
                if alive:
                    renew.append(lease)
                    keys.append(key)
        for key in list(self._leases):
            if key not in seen and not self._is_orphan(key[0]):
                del self._leases[key]
        return renew, keys

    def _is_orphan(self, slot: int) -> bool:
        return self.table.slot(slot)[0] in (ORPHANED_CRASH, ORPHANED_STOP)

    def release_orphans(self) -> int:
        """Release the jobs of dead children (fenced); return how many."""
        items = []
        slots = []
        for slot in range(self.table.nslots):
            state = self.table.slot(slot)[0]
            if state not in (ORPHANED_CRASH, ORPHANED_STOP):
                continue
            slots.append(slot)
            known = set()
            now = time.monotonic()
            for held in self.table.held(slot):
                lease = self._leases.get((slot, held.entry, held.job_id, held.attempt))
                # Killed past its timeout (see Arbiter.murder_workers): the
                # attempt failed, and the job is released at once.
                timed_out = (lease is not None and lease.lost_reason == "timeout") or (
                    held.timeout is not None and held.started_at is not None
                    and now - held.started_at >= held.timeout)
                items.append((held.job_id, held.attempt, state == ORPHANED_CRASH and not timed_out,
                              f"timed out after {held.timeout:g}s; worker killed" if timed_out else None))
                known.add(held.job_id)
            # A child can die between its claim's commit and publishing it:
            # those jobs are found by its exact name (this supervisor's
            # instance id in it: another supervisor's child with the same
            # host, pid and number is not this one), then released by
            # (id, attempt).
            info = self.table.slot(slot)
            for job_id, attempt in self.manager.owned(worker_name(info.pid, info.number, self.instance)):
                if job_id not in known:
                    items.append((job_id, attempt, state == ORPHANED_CRASH, None))
        if not slots:
            return 0
        released = self.manager.release(items) if items else 0
        for slot in slots:
            self.table.clear_all(slot)
            self.table.set_state(slot, FREE)
            for key in [k for k in self._leases if k[0] == slot]:
                del self._leases[key]
        return released

    def next_round(self) -> float:
        """When the leases held now next need a round (monotonic)."""
        now = time.monotonic()
        leases, _keys = self.held_leases(now)
        return self.manager.next_round(leases, now)

    def run_once(self) -> None:
        now = time.monotonic()
        try:
            self.release_orphans()
        except Exception as exc:  # noqa: BLE001 - retried next round; jobs stay orphaned
            log.warning("releasing jobs of dead workers failed: %s", exc)
        leases, keys = self.held_leases(now)
        result = self.manager.run_once(leases, horizon=now + self.manager.window(leases))
        if result.sent or not leases:   # a round that only marked a timeout keeps the last count
            metrics.HEARTBEAT_LEASES.set(result.sent)
        for lease, (slot, entry, job_id, attempt) in zip(leases, keys, strict=True):
            self.table.write_renewal(slot, entry, job_id, attempt, deadline=lease.deadline,
                                     lost=lease.lost_reason, lost_at=lease.lost_at, failing=lease.failing)
        self.rounds += 1
        self.table.set_renewal_stats(self.rounds, self.manager.statements, os.getpid(), time.monotonic())
        proctitle.set(f"pgfence heartbeat [{len(leases)} leases]")
        # A job that ended between reading the table and the renewal comes
        # back "rejected"; only leases still held are news worth a line.
        still_held = [lease for lease, (slot, entry, job_id, attempt) in zip(leases, keys, strict=True)
                      if lease.lost_reason and any(h.entry == entry and h.job_id == job_id and h.attempt == attempt
                                                   for h in self.table.held(slot))]
        if still_held:
            log.info("heartbeat round: %d renewed, %d lost: %s", result.renewed, len(still_held),
                     ", ".join(f"job {lease.id} attempt {lease.attempt} ({lease.lost_reason})" for lease in still_held))


def main(dsn: str, settings: Settings, table: SlotTable, liveness: float, instance: str,
         started: float | None = None) -> int:
    """The heartbeat process's life; returns its exit status.  ``started``
    is when the supervisor started (``time.time()`` in the arbiter)."""
    parent = os.getppid()
    proctitle.set("pgfence heartbeat [0 leases]")
    stop = False
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    proctitle.die_with_parent(parent)
    signal.signal(signal.SIGUSR1, lambda *_: None)   # wake-up only
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    # Blocked by the arbiter across the fork (see child.STARTUP_BLOCKED).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
    process = RenewalProcess(dsn, settings, table, liveness=liveness, instance=instance)
    # pgfence's own VACUUM of the jobs table, on a thread and a connection
    # of its own: no renewal waits for it (see pgfence.worker.vacuum).
    vacuum = SelfVacuum(dsn, settings.self_vacuum_dead_tuples) if settings.self_vacuum_dead_tuples else None
    if vacuum is not None:
        vacuum.start()
    # The schedules of periodic jobs this supervisor declares, ticked on a
    # thread and a connection of their own (see pgfence.scheduling.scheduler).
    schedules = declared(settings)
    scheduler = Scheduler(dsn, schedules, grace=settings.periodic_grace) if schedules else None
    if scheduler is not None:
        scheduler.start()
    # This supervisor's row of pgfence.supervisors, on a thread and a
    # connection of its own (see pgfence.renewal.presence).
    presence = Presence(dsn, table, instance=instance, arbiter_pid=parent, started_at=arbiter_started_at(started))
    presence.start()
    # The handlers' options in pgfence.kinds: recorded by `pgfence run` at
    # start, and again here by the manager forked after a reload (the
    # re-imported modules may declare new ones), until the database answers.
    record = KindsRecord(dsn, registry.specs(), by=supervisor_name(parent, instance))
    record.start()
    next_at = time.monotonic()
    try:
        while not stop:
            now = time.monotonic()
            if now >= next_at:
                process.run_once()
                next_at = process.next_round()
            else:
                # Between rounds: dead children's jobs (SIGUSR1), and leases
                # claimed since that are due sooner than the planned round.
                try:
                    process.release_orphans()
                except Exception as exc:  # noqa: BLE001
                    log.warning("releasing jobs of dead workers failed: %s", exc)
                next_at = min(next_at, process.next_round())
            process.table.set_renewal_stats(process.rounds, process.manager.statements, os.getpid(),
                                            time.monotonic())
            ready, _, _ = select.select([wake_r], [], [],
                                        max(0.0, min(process.wake, next_at - time.monotonic())))
            if ready:
                os.read(wake_r, 512)
        process.release_orphans()
    finally:
        presence.stop(remove=stop)
        record.stop()
        if scheduler is not None:
            scheduler.stop()
        if vacuum is not None:
            vacuum.stop()
        process.manager.stop()
    return 0
