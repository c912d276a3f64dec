"""The kinds of tests/test_limits_faults.py, as plain functions:
tests/limits_sync_handlers.py, limits_async_handlers.py and
limits_mixed_handlers.py register them with their concurrency limits, each
module the kinds of its mode.  Loaded by ``pgfence run`` children only
(tests/ is on their PYTHONPATH); never registered in the test process.

Every attempt records itself in ``limits_t.runs`` (made by the test,
primary key ``(job_id, attempt)``): a row written at its start on the job's
own connection (autocommit, outside any fence: it stays whatever happens
next), with the database's clock_timestamp(), and its end written through
the job's fenced block, so that the end commits only with the attempt's
completion: a stale attempt's end is refused with it, and its row keeps
``ended_at`` NULL.

What an attempt does, from its payload:

- ``key``: the job's concurrency key, copied into its row (a finished job
  keeps none in pgfence.all_jobs);
- ``work``: seconds between its start and its end, every attempt;
- ``before`` (attempt 1 only): seconds more, without ever looking at the
  lease, so that only the fence can keep a stale end out;
- ``hold``: waits between start and end until the test writes the job's
  id (or 0, for every job) into ``limits_t.released``, every attempt;
- ``block`` (attempt 1 only): blocks this long before its start row is
  written (claimed and not started: the test kills it there);
- ``fail`` (attempt 1 only): raises after its start row, for a retry.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pgfence import AsyncJob, Job

START = ("INSERT INTO limits_t.runs (job_id, attempt, kind, key, pid)"
         " VALUES (%(job_id)s, %(attempt)s, %(kind)s, %(key)s, %(pid)s)")
END = "UPDATE limits_t.runs SET ended_at = clock_timestamp() WHERE job_id = %(job_id)s AND attempt = %(attempt)s"
RELEASED = "SELECT count(*) FROM limits_t.released WHERE job_id IN (%(job_id)s, 0)"
#: How often a held attempt looks whether it was released.
POLL = 0.02


def _row(job: Job | AsyncJob) -> dict[str, Any]:
    return {"job_id": job.id, "attempt": job.attempt, "kind": job.kind, "key": job.payload.get("key"),
            "pid": os.getpid()}


def _first(job: Job | AsyncJob, name: str) -> float:
    return float(job.payload.get(name, 0)) if job.attempt == 1 else 0.0


def _sleep(seconds: float) -> None:
    """Sleep without looking at the lease (in steps, as a busy handler)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))


async def _asleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))


def sync_run(job: Job) -> None:
    _sleep(_first(job, "block"))
    row = _row(job)
    with job.borrow() as conn:
        conn.execute(START, row)
    if job.attempt == 1 and job.payload.get("fail"):
        raise RuntimeError("attempt 1 fails on purpose")
    _sleep(float(job.payload.get("work", 0)) + _first(job, "before"))
    while job.payload.get("hold"):
        with job.borrow() as conn:
            if conn.execute(RELEASED, row).fetchone()[0]:
                break
        time.sleep(POLL)
    with job.fenced() as conn:
        conn.execute(END, row)


async def async_run(job: AsyncJob) -> None:
    await _asleep(_first(job, "block"))
    row = _row(job)
    async with job.borrow() as conn:
        await conn.execute(START, row)
    if job.attempt == 1 and job.payload.get("fail"):
        raise RuntimeError("attempt 1 fails on purpose")
    await _asleep(float(job.payload.get("work", 0)) + _first(job, "before"))
    while job.payload.get("hold"):
        async with job.borrow() as conn:
            if (await (await conn.execute(RELEASED, row)).fetchone())[0]:
                break
        await asyncio.sleep(POLL)
    async with job.fenced() as conn:
        await conn.execute(END, row)
