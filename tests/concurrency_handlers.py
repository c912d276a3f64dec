"""Synchronous handlers for tests/test_concurrency.py (no async kind here,
so that a child loading this module alone starts no event loop and its
capacity is its thread count).

Loaded by ``pgfence run`` children with ``--handlers concurrency_handlers``
(tests/ is on their PYTHONPATH); never registered in the test process.
Every kind that finishes writes one row into ``pgfence_examples.effects``
through the fence, naming the job, the attempt and the child's pid: two
rows for one job would be a double run; ``c_pause`` alone writes nothing,
so that its jobs are completed by the worker's batched completion.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pgfence import Job, handler
from pgfence.handlers.tables import INSERT_EFFECT

#: What the hog kind keeps: memory this process never gives back (a leak).
KEPT: list[bytes] = []


def _number(job: Job, key: str = "seconds") -> float:
    payload: Any = job.payload if isinstance(job.payload, dict) else {}
    return float(payload.get(key, 0))


def _effect_row(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "attempt": job.attempt, "key": job.idempotency_key, "worker": str(os.getpid())}


def _write_effect(job: Job) -> None:
    with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, _effect_row(job))


def _work(job: Job, seconds: float) -> None:
    """Work ``seconds``, checking the lease between short sleeps."""
    deadline = time.monotonic() + seconds
    while True:
        job.check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.05, left))


@handler("c_effect")
def c_effect(job: Job) -> None:
    """Works payload.seconds (checking its lease), then writes its effect."""
    _work(job, _number(job))
    _write_effect(job)


@handler("c_pause")
def c_pause(job: Job) -> None:
    """Works payload.seconds (checking its lease) and writes nothing: the
    worker completes it, batched with the others that ended meanwhile."""
    _work(job, _number(job))


@handler("c_first_slow")
def c_first_slow(job: Job) -> None:
    """Attempt 1 works payload.seconds (checking its lease); any later
    attempt writes its effect at once."""
    _work(job, _number(job) if job.attempt == 1 else 0.0)
    _write_effect(job)


@handler("c_hold", lease=1.5)
def c_hold(job: Job) -> None:
    """Attempt 1 writes its effect inside its fenced transaction, then stays
    there payload.seconds without ever looking at its (1.5 s) lease: its
    completion can only be kept out by the fence.  Later attempts commit at
    once."""
    seconds = _number(job) if job.attempt == 1 else 0.0
    with job.fenced() as conn:
        conn.execute(INSERT_EFFECT, _effect_row(job))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)


@handler("c_hang", timeout=1)
def c_hang(job: Job) -> None:
    """Attempt 1 hangs payload.seconds (timeout 1 s) without ever calling
    check(): a thread nothing can stop.  Later attempts write their effect
    at once."""
    if job.attempt == 1:
        deadline = time.monotonic() + _number(job)
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return
    _write_effect(job)


@handler("c_hog")
def c_hog(job: Job) -> None:
    """Keeps payload.mib MiB of touched (resident) memory for good, then
    writes its effect."""
    KEPT.append(b"x" * int(_number(job, "mib") * 2**20))
    _write_effect(job)
