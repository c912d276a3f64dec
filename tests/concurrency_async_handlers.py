"""An async-only handler module for tests/test_concurrency.py: no sync kind
is registered with it, so a child's claims are sized to its event loop's
free slots alone.

Loaded by ``pgfence run`` children with ``--handlers
concurrency_async_handlers`` (tests/ is on their PYTHONPATH); never
registered in the test process.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pgfence import AsyncJob, handler
from pgfence.handlers.tables import INSERT_EFFECT


@handler("c_async_effect")
async def c_async_effect(job: AsyncJob) -> None:
    """Works payload.seconds on the loop (checking its lease), then writes
    its effect through the async fenced_writes."""
    payload: Any = job.payload if isinstance(job.payload, dict) else {}
    deadline = time.monotonic() + float(payload.get("seconds", 0))
    while True:
        job.check()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(0.05, left))
    async with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "key": job.idempotency_key,
                                       "worker": str(os.getpid())})


@handler("c_async_wait")
async def c_async_wait(job: AsyncJob) -> None:
    """Waits payload.seconds on the loop (checking its lease) and writes
    nothing: the worker completes it, fenced, with others."""
    payload: Any = job.payload if isinstance(job.payload, dict) else {}
    deadline = time.monotonic() + float(payload.get("seconds", 0))
    while (left := deadline - time.monotonic()) > 0:
        job.check()
        await asyncio.sleep(min(0.05, left))


@handler("c_async_slow_write")
async def c_async_slow_write(job: AsyncJob) -> None:
    """Holds a connection of the loop's pool payload.seconds inside its
    fenced block (a slow write), then completes: many at once queue for the
    pool's few connections."""
    payload: Any = job.payload if isinstance(job.payload, dict) else {}
    async with job.fenced() as conn:
        await conn.execute("SELECT pg_sleep(%s)", (float(payload.get("seconds", 0)),))
        await conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "key": job.idempotency_key,
                                           "worker": str(os.getpid())})
