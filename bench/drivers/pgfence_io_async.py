"""pgfence handlers for the benchmark's io section, ``async def`` handlers
(run on a worker child's event loop: ``pgfence run --async-concurrency C``),
the counterparts of :mod:`bench.drivers.pgfence_io_sync`:

- ``io_sleep``: ``asyncio.sleep``; writes nothing;
- ``io_http``: a GET to the harness's delaying HTTP server over
  ``asyncio.open_connection`` (keep-alive, pooled per loop); writes nothing;
- ``io_row``: ``asyncio.sleep``, then one row through the fence
  (``async with job.fenced_writes()``, as the built-in ``async_effect``).

Same kind names as the sync module: a run loads one module or the other.
"""

from __future__ import annotations

import asyncio
import os

from pgfence import AsyncJob, handler
from pgfence.handlers.tables import INSERT_EFFECT

from bench.drivers.ioclient import get_async

WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000


@handler("io_sleep")
async def io_sleep(job: AsyncJob) -> None:
    await asyncio.sleep(WAIT)


@handler("io_http")
async def io_http(job: AsyncJob) -> None:
    status = await get_async()
    if status != 200:
        raise RuntimeError(f"HTTP {status}")


@handler("io_row")
async def io_row(job: AsyncJob) -> None:
    await asyncio.sleep(WAIT)
    async with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                       "key": job.idempotency_key, "worker": str(os.getpid())})
