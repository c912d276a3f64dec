"""Async counterparts of the built-in handlers: ``async_sleep`` and
``async_effect``, run on the worker's event loop.

A module of their own: loading an ``async def`` handler starts an event loop
in every worker (with ``async_concurrency`` slots), which a worker serving
only the synchronous built-ins does not need.  Load both with
``--handlers pgfence.handlers.builtin,pgfence.handlers.aio``.
"""

from __future__ import annotations

import asyncio
import os
import time

from pgfence import AsyncJob, handler
from pgfence.handlers.payloads import seconds_of
from pgfence.handlers.tables import INSERT_EFFECT


async def async_work_for(job: AsyncJob, seconds: float, *, step: float = 0.05) -> None:
    """:func:`work_for` on the event loop: waits without blocking it."""
    deadline = time.monotonic() + seconds
    while True:
        job.check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(min(step, left))


@handler("async_sleep")
async def async_sleep(job: AsyncJob) -> None:
    """``sleep`` as an async handler, on the worker's event loop."""
    await async_work_for(job, seconds_of(job))


@handler("async_effect")
async def async_effect(job: AsyncJob) -> None:
    """``effect`` as an async handler: one effect row through the fence."""
    await async_work_for(job, seconds_of(job))
    async with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                       "key": job.idempotency_key, "worker": str(os.getpid())})
