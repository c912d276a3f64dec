"""A lease as its holder sees it: the local deadline and whether it is lost.

The deadline is local (``time.monotonic``) and always conservative: it is the
time a claim or renewal statement was SENT plus the lease length, and the
database stamps ``lease_until = now() + lease`` no earlier than that.  So when
the database cannot be reached, the holder gives the job up before the
database could hand it to someone else.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from pgfence.observe import metrics


@dataclass(eq=False)
class Lease:
    id: int
    attempt: int
    seconds: float
    queue: str = "default"
    kind: str = ""
    #: Monotonic time after which the lease must be taken as lost.
    deadline: float = 0.0
    #: Monotonic time the claim was SENT (the start of the first deadline).
    claimed_at: float = field(default_factory=time.monotonic)
    #: Monotonic time the handler started (None: not yet, e.g. waiting
    #: behind other jobs of its batch); ``timeout`` counts from it.
    started_at: float | None = None
    timeout: float | None = None
    #: When false the deadline is not enforced (the demo's unprotected mode).
    enforce_deadline: bool = True
    lost_reason: str | None = None
    #: Monotonic time the lease was marked lost (0 while held).
    lost_at: float = 0.0
    #: Count the loss in pgfence_lease_lost_total.  The heartbeat process
    #: keeps copies of its children's leases with this off, so that each
    #: loss is counted once, by the worker that learns it.
    count: bool = True
    #: A renewal of this lease was sent and has not been accepted (it failed,
    #: or its answer has not come yet): a deadline passed now is
    #: ``renewal_failed``, not merely ``expired``.
    failing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` was accepted by the database.

        A timed-out lease is still renewed (the job stays held until its
        worker ends the attempt or is killed), so its deadline moves too.
        """
        with self._lock:
            if self.lost_reason in (None, "timeout"):
                self.deadline = max(self.deadline, sent_at + self.seconds)
                self.failing = False

    def extend(self, deadline: float) -> None:
        """Take a deadline computed elsewhere (the heartbeat process)."""
        with self._lock:
            if self.lost_reason is None:
                self.deadline = max(self.deadline, deadline)

    def mark_lost(self, reason: str) -> bool:
        """Record that the lease is gone; True the first time only.

        The first reason wins and is counted once in
        ``pgfence_lease_lost_total``.
        """
        with self._lock:
            if self.lost_reason is not None:
                return False
            self.lost_reason = reason
            self.lost_at = time.monotonic()
        if self.count:
            metrics.LEASE_LOST.labels(self.queue, self.kind, reason).inc()
        return True

    def expired(self, now: float | None = None) -> bool:
        return self.enforce_deadline and (time.monotonic() if now is None else now) >= self.deadline

    def expiry_reason(self) -> str:
        """Why a lease whose deadline passed is lost: ``renewal_failed`` if a
        renewal was tried and failed since the last success, else
        ``expired`` (nobody renewed it in time: its process was stopped or
        hung, or its heartbeat fell behind)."""
        return "renewal_failed" if self.failing else "expired"

    def lost(self) -> str | None:
        """The reason the lease is lost, or None while it is held."""
        if self.lost_reason is None and self.expired():
            self.mark_lost(self.expiry_reason())
        return self.lost_reason

    @property
    def renewed_at(self) -> float:
        """When the claim or last accepted renewal was sent (monotonic)."""
        return self.deadline - self.seconds

    def timed_out(self, now: float | None = None) -> bool:
        """The handler has run ``timeout`` seconds (counted from its start,
        not from the claim)."""
        if self.timeout is None or self.started_at is None:
            return False
        return (time.monotonic() if now is None else now) - self.started_at >= self.timeout


class LeaseTracker(Protocol):
    """What renews a worker's leases while its jobs run: its own heartbeat
    manager (``pgfence work``) or, in a child of ``pgfence run``, the slot
    table the shared heartbeat manager reads."""

    def track(self, lease: Lease) -> None: ...

    def handler_started(self, lease: Lease) -> None: ...

    def untrack(self, lease: Lease) -> None: ...
