"""The handlers of the load test's limited mixes (``limited``, ``keyed``),
loaded by its supervisors (``--handlers``) when the mix has such jobs.

Each kind is declared with its limits, ``@handler(kind, concurrency=...,
per_key_concurrency=...)``, as any handler module declares them, so every
worker records them in ``pgfence.limits`` when it starts.  Which kinds and
limits come from the run's ``--mix``, told to the supervisors in
``PGFENCE_LOADTEST_LIMITS`` (:func:`pgfence.tools.loadtest.mix.encode`); the
kind names carry their limits.  Without that variable this module registers
nothing.

A job works like ``sleep``: ``payload.seconds`` of work that checks its
lease between small steps.  What the audit counts is the attempt history the
database keeps (pgfence.job_attempts and the finished jobs), not anything
these handlers write.
"""

from __future__ import annotations

import os

from pgfence import Job, handler
from pgfence.handlers.builtin import work_for
from pgfence.handlers.payloads import seconds_of
from pgfence.tools.loadtest.mix import LIMITS_ENV, decode


def limited(job: Job) -> None:
    """Works for ``payload.seconds`` seconds, checking its lease."""
    work_for(job, seconds_of(job))


def register(text: str) -> list[str]:
    """Register :func:`limited` for each kind of ``text`` (LIMITS_ENV's
    form) with its limits; the kinds registered."""
    kinds = []
    for kind, concurrency, per_key in decode(text):
        handler(kind, concurrency=concurrency, per_key_concurrency=per_key)(limited)
        kinds.append(kind)
    return kinds


register(os.environ.get(LIMITS_ENV, ""))
