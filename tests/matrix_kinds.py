"""The kinds of the fault matrix (tests/test_fault_matrix.py), as plain
functions: tests/matrix_sync_handlers.py, matrix_async_handlers.py and
matrix_mixed_handlers.py register them under the same names, each module the
kinds of its mode.  Loaded by ``pgfence run`` children only (tests/ is on
their PYTHONPATH); never registered in the test process.

Every kind ends by writing ONE effect row, ``(job id, attempt, pid)``, into
``matrix.effects`` (made by the test, primary key ``(job_id, attempt)``)
through the job's fenced block, so that an effect commits only with the
attempt's completion, and returns the same three as its result (stored on
the history row of the attempt that completed the job, never a stale
attempt's).  The first attempt works first, without ever looking at
its lease, so that the fence alone can keep a stale attempt's write out:
``payload.before`` seconds before the block, ``payload.inside`` seconds inside
it, after the row is written.  Later attempts write at once.

- ``m_def`` / ``m_async``: the effect, as above;
- ``m_def_hang`` / ``m_async_hang`` (``timeout=1``): attempt 1 hangs for a
  minute (a thread asleep; an ``await`` the timeout cancels) and writes
  nothing; later attempts are ``m_def`` / ``m_async``;
- ``m_async_block`` (``timeout=1``): attempt 1 blocks its event loop for
  ``payload.block`` seconds (``time.sleep`` inside ``async def``) and returns
  without writing; later attempts are ``m_async``.
"""

from __future__ import annotations

import asyncio
import os
import time

from pgfence import AsyncJob, Job

INSERT = "INSERT INTO matrix.effects (job_id, attempt, pid) VALUES (%(job_id)s, %(attempt)s, %(pid)s)"
#: The first attempt of a hanging kind hangs this long.
HANG = 60.0
TIMEOUT = 1


def _row(job: Job | AsyncJob) -> dict[str, int]:
    return {"job_id": job.id, "attempt": job.attempt, "pid": os.getpid()}


def _seconds(job: Job | AsyncJob, name: str) -> float:
    return float(job.payload.get(name, 0)) if job.attempt == 1 else 0.0


def _sleep(seconds: float) -> None:
    """Sleep without looking at the lease (in steps, as a busy handler)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


async def _asleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def sync_effect(job: Job) -> dict[str, int]:
    _sleep(_seconds(job, "before"))
    with job.fenced() as conn:
        conn.execute(INSERT, _row(job))
        _sleep(_seconds(job, "inside"))
    return _row(job)


async def async_effect(job: AsyncJob) -> dict[str, int]:
    await _asleep(_seconds(job, "before"))
    async with job.fenced() as conn:
        await conn.execute(INSERT, _row(job))
        await _asleep(_seconds(job, "inside"))
    return _row(job)


def sync_hang(job: Job) -> dict[str, int]:
    if job.attempt == 1:
        _sleep(HANG)
        raise RuntimeError("hung for a minute")
    return sync_effect(job)


async def async_hang(job: AsyncJob) -> dict[str, int]:
    if job.attempt == 1:
        await _asleep(HANG)
        raise RuntimeError("hung for a minute")
    return await async_effect(job)


async def async_block(job: AsyncJob) -> dict[str, int] | None:
    if job.attempt == 1:
        time.sleep(float(job.payload.get("block", 3)))   # blocks the whole loop
        return None
    return await async_effect(job)
