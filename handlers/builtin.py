"""Small handlers for tests, demos and load tests: noop, sleep, fail, effect.
Their async counterparts are in :mod:`pgfence.handlers.aio`.

Like any handler module, this one uses only pgfence's public API.  The
``effect`` kind writes to ``pgfence_examples.effects``, which
:func:`pgfence.handlers.tables.create_tables` creates.
"""

from __future__ import annotations

import os
import time

from pgfence import Job, handler
from pgfence.handlers.payloads import seconds_of
from pgfence.handlers.tables import INSERT_EFFECT


def work_for(job: Job, seconds: float, *, step: float = 0.05) -> None:
    """Simulated work that checks the lease between small steps, as a real
    handler should before every effect."""
    deadline = time.monotonic() + seconds
    while True:
        job.check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(step, left))


@handler("noop")
def noop(job: Job) -> None:
    """Does nothing; completed (fenced) by the worker."""


@handler("sleep")
def sleep(job: Job) -> None:
    """Works for ``payload.seconds`` seconds, checking its lease."""
    work_for(job, seconds_of(job))


@handler("fail")
def fail(job: Job) -> None:
    """Always raises; ``payload.message`` is the error text."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    raise RuntimeError(str(payload.get("message", "failed on purpose")))


@handler("effect")
def effect(job: Job) -> None:
    """Works for ``payload.seconds`` then writes one effect row through the
    fence.  Two rows for one job would be a double run."""
    work_for(job, seconds_of(job))
    with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                       "key": job.idempotency_key, "worker": str(os.getpid())})

