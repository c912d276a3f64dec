"""The shared table through which children, the heartbeat manager and the
arbiter talk, created before any fork (an anonymous shared ``mmap``).

Each child owns a slot.  The child writes when it was last alive (its
liveness tick, which says the process runs; it renews nothing) and the jobs it
holds (id, attempt, lease, claim time, timeout); the renewal process (the
heartbeat manager) writes back, per job, the new local deadline after a lease
renewal, whether renewals are failing, and the reason if the lease is lost;
the arbiter writes the slot's state (free, active, orphaned).  Every field has
exactly one writer, and a renewal write names the job and attempt it is
about, so a late write about a previous job can never be taken for the
outcome of the current one.  No locks are needed.
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass
from typing import NamedTuple

FREE, ACTIVE, ORPHANED_CRASH, ORPHANED_STOP = 0, 1, 2, 3

#: Lost-reason codes in shared memory.
REASONS = ("", "renewal_rejected", "renewal_failed", "timeout", "cancelled", "fence_rejected", "expired")
REASON_CODE = {name: code for code, name in enumerate(REASONS)}

# magic, nslots, njobs | renewal process: rounds, statements, pid, alive_at |
# arbiter: alive_at, target workers
_HEADER = struct.Struct("<8sqqqqqddq")
_RENEWAL_HEAD = struct.Struct("<qqqd")
_RENEWAL_HEAD_OFF = 24
_ARB_HEAD = struct.Struct("<dq")
_ARB_HEAD_OFF = 56
_SLOT = struct.Struct("<qqqd")         # state, pid, worker number, alive_at
_ALIVE_OFF = 24                        # alive_at's offset in _SLOT
# Child-written: job id, attempt, lease s, claimed_at (the claim's send
# time), started_at (the handler's start; 0: not yet), timeout (0: none).
_JOB = struct.Struct("<qqdddd")
# Renewal-written: job id, attempt, deadline, lost code, lost_at, failing
# (a renewal failed since the last success).
_RENEWAL = struct.Struct("<qqdqdq")
_MAGIC = b"pgfence1"


class SlotInfo(NamedTuple):
    """A slot as the arbiter set it, and the child's liveness tick."""

    state: int
    pid: int
    number: int
    #: When the child last said it is alive (monotonic; 0: not up yet).
    alive_at: float


class RenewalStats(NamedTuple):
    """What the renewal process publishes about itself."""

    rounds: int
    statements: int
    #: The renewal process that wrote this (0: none has yet).
    pid: int
    #: When it last went round its loop (monotonic): a stall detector's input.
    alive_at: float


class ArbiterState(NamedTuple):
    """What the arbiter publishes for the metrics server's probes."""

    #: When the arbiter's loop last turned (monotonic).
    alive_at: float
    #: The number of workers it aims at.
    target: int


class Renewal(NamedTuple):
    """The renewal process's last word about one job and attempt."""

    deadline: float
    lost: str | None
    lost_at: float
    failing: bool


@dataclass(frozen=True)
class Held:
    """A job a child holds, as read from its slot."""

    slot: int
    entry: int
    job_id: int
    attempt: int
    lease: float
    claimed_at: float
    started_at: float | None
    timeout: float | None


class SlotTable:
    def __init__(self, nslots: int, njobs: int):
        if nslots < 1 or njobs < 1:
            raise ValueError("nslots and njobs must be at least 1")
        self.nslots = nslots
        self.njobs = njobs
        self._entry = _JOB.size + _RENEWAL.size
        self._slot = _SLOT.size + njobs * self._entry
        self.size = _HEADER.size + nslots * self._slot
        # An anonymous MAP_SHARED mapping: every process forked after this
        # line sees the same bytes.
        self.buf = mmap.mmap(-1, self.size, flags=mmap.MAP_SHARED)
        _HEADER.pack_into(self.buf, 0, _MAGIC, nslots, njobs, 0, 0, 0, 0.0, 0.0, 0)

    # -- offsets ---------------------------------------------------------------

    def _slot_off(self, slot: int) -> int:
        if not 0 <= slot < self.nslots:
            raise IndexError(slot)
        return _HEADER.size + slot * self._slot

    def _job_off(self, slot: int, entry: int) -> int:
        if not 0 <= entry < self.njobs:
            raise IndexError(entry)
        return self._slot_off(slot) + _SLOT.size + entry * self._entry

    # -- header: the renewal process's and the arbiter's own news ------------------

    def renewal_stats(self) -> RenewalStats:
        return RenewalStats._make(_RENEWAL_HEAD.unpack_from(self.buf, _RENEWAL_HEAD_OFF))

    def set_renewal_stats(self, rounds: int, statements: int, pid: int, alive_at: float) -> None:
        """Written by the renewal process only."""
        _RENEWAL_HEAD.pack_into(self.buf, _RENEWAL_HEAD_OFF, rounds, statements, pid, alive_at)

    def arbiter_state(self) -> ArbiterState:
        return ArbiterState._make(_ARB_HEAD.unpack_from(self.buf, _ARB_HEAD_OFF))

    def set_arbiter_state(self, alive_at: float, target: int) -> None:
        """Written by the arbiter only."""
        _ARB_HEAD.pack_into(self.buf, _ARB_HEAD_OFF, alive_at, target)

    def workers_up(self, liveness: float) -> int:
        """Children that are up: connected, and alive within ``liveness``."""
        now = time.monotonic()
        up = 0
        for slot in range(self.nslots):
            info = self.slot(slot)
            if info.state == ACTIVE and info.alive_at > 0 and now - info.alive_at <= liveness:
                up += 1
        return up

    # -- slot (arbiter and child) -------------------------------------------------

    def slot(self, slot: int) -> SlotInfo:
        return SlotInfo._make(_SLOT.unpack_from(self.buf, self._slot_off(slot)))

    def set_slot(self, slot: int, state: int, pid: int, number: int) -> None:
        """Set by the arbiter; alive_at starts at 0 until the child is up."""
        off = self._slot_off(slot)
        _SLOT.pack_into(self.buf, off, state, pid, number, 0.0)

    def set_state(self, slot: int, state: int) -> None:
        struct.pack_into("<q", self.buf, self._slot_off(slot), state)

    def mark_alive(self, slot: int) -> None:
        """The child's liveness tick: it runs (and is connected).  Only a
        child that keeps ticking has its leases renewed."""
        struct.pack_into("<d", self.buf, self._slot_off(slot) + _ALIVE_OFF, time.monotonic())

    def free_slot(self) -> int | None:
        for slot in range(self.nslots):
            if self.slot(slot)[0] == FREE:
                return slot
        return None

    def orphans_left(self) -> bool:
        """Whether a slot is still orphaned: a dead child's jobs not yet
        released by the renewal process."""
        return any(self.slot(s).state in (ORPHANED_CRASH, ORPHANED_STOP) for s in range(self.nslots))

    # -- jobs (child writes) -------------------------------------------------------

    def publish(self, slot: int, entry: int, job_id: int, attempt: int, lease: float,
                claimed_at: float, timeout: float | None, started_at: float | None = None) -> None:
        off = self._job_off(slot, entry)
        # The id goes last so a reader never sees a new id with old numbers.
        struct.pack_into("<dddd", self.buf, off + 16, lease, claimed_at, started_at or 0.0, timeout or 0.0)
        struct.pack_into("<q", self.buf, off + 8, attempt)
        struct.pack_into("<q", self.buf, off, job_id)

    def set_started(self, slot: int, entry: int, started_at: float) -> None:
        """The handler of the job at ``entry`` started: its timeout counts
        from ``started_at``."""
        struct.pack_into("<d", self.buf, self._job_off(slot, entry) + 32, started_at)

    def clear(self, slot: int, entry: int) -> None:
        struct.pack_into("<q", self.buf, self._job_off(slot, entry), 0)

    def held(self, slot: int) -> list[Held]:
        out = []
        for entry in range(self.njobs):
            job_id, attempt, lease, claimed_at, started_at, timeout = _JOB.unpack_from(
                self.buf, self._job_off(slot, entry))
            if job_id:
                out.append(Held(slot, entry, job_id, attempt, lease, claimed_at, started_at or None,
                                timeout or None))
        return out

    def clear_all(self, slot: int) -> None:
        for entry in range(self.njobs):
            off = self._job_off(slot, entry)
            _JOB.pack_into(self.buf, off, 0, 0, 0.0, 0.0, 0.0, 0.0)
            _RENEWAL.pack_into(self.buf, off + _JOB.size, 0, 0, 0.0, 0, 0.0, 0)

    # -- the renewal process writes, the child and the arbiter read ------------------

    def write_renewal(self, slot: int, entry: int, job_id: int, attempt: int, *, deadline: float = 0.0,
                      lost: str | None = None, lost_at: float = 0.0, failing: bool = False) -> None:
        off = self._job_off(slot, entry) + _JOB.size
        _RENEWAL.pack_into(self.buf, off, 0, 0, deadline, REASON_CODE[lost] if lost else 0, lost_at, int(failing))
        struct.pack_into("<q", self.buf, off + 8, attempt)
        struct.pack_into("<q", self.buf, off, job_id)

    def read_renewal(self, slot: int, entry: int, job_id: int, attempt: int) -> Renewal | None:
        """What the renewal process last wrote about exactly this job and
        attempt, or None when it wrote nothing about it yet."""
        off = self._job_off(slot, entry) + _JOB.size
        written_id, written_attempt, deadline, code, lost_at, failing = _RENEWAL.unpack_from(self.buf, off)
        if (written_id, written_attempt) != (job_id, attempt):
            return None
        # Re-read the identity: a write in progress changes it first... last.
        if struct.unpack_from("<qq", self.buf, off) != (job_id, attempt):
            return None
        return Renewal(deadline, REASONS[code] or None, lost_at, bool(failing))
