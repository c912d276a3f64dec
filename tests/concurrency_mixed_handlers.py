"""A handler module with sync and async kinds both, for
tests/test_concurrency.py.

Loaded by ``pgfence run`` children with ``--handlers
concurrency_mixed_handlers`` (tests/ is on their PYTHONPATH); never
registered in the test process.

``c_meet_sync`` and ``c_meet_async`` only finish when the other has started
in the same process: each records its own start in a module-level set and
waits (10 s at most) for the other's.  Done on their first attempt, they
ran at the same time in one child, one on a worker thread, the other on the
child's event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pgfence import AsyncJob, Job, handler
from pgfence.handlers.tables import INSERT_EFFECT

#: How long one meeting handler waits for the other.
MEET_WITHIN = 10.0

#: Which of the two meeting kinds has started in this process.
STARTED: set[str] = set()


def _effect_row(job: Job | AsyncJob) -> dict[str, Any]:
    return {"job_id": job.id, "attempt": job.attempt, "key": job.idempotency_key, "worker": str(os.getpid())}


@handler("c_meet_sync")
def meet_sync(job: Job) -> None:
    STARTED.add("sync")
    deadline = time.monotonic() + MEET_WITHIN
    while "async" not in STARTED:
        job.check()
        if time.monotonic() > deadline:
            raise RuntimeError("no async job ran alongside this one")
        time.sleep(0.01)
    with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, _effect_row(job))


@handler("c_meet_async")
async def meet_async(job: AsyncJob) -> None:
    STARTED.add("async")
    deadline = time.monotonic() + MEET_WITHIN
    while "sync" not in STARTED:
        job.check()
        if time.monotonic() > deadline:
            raise RuntimeError("no sync job ran alongside this one")
        await asyncio.sleep(0.01)
    async with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, _effect_row(job))


@handler("c_block_loop", timeout=1)
async def block_loop(job: AsyncJob) -> None:
    """Attempt 1 blocks the child's event loop 2 s (a sync sleep inside
    async def), past its 1 s timeout; later attempts end at once (completed
    by the worker)."""
    if job.attempt == 1:
        time.sleep(2)
