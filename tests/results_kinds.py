"""Kinds that return results, for tests/test_results.py: the same
behaviours as def kinds (``r_*``) and async def kinds (``a_*``), registered
by tests/results_sync_handlers.py, results_async_handlers.py and
results_mixed_handlers.py.  Loaded by ``pgfence run`` children only."""

from __future__ import annotations

from pgfence import AsyncJob, Job
from pgfence.results import MAX_BYTES

INSERT = "INSERT INTO results.effects (job_id, attempt) VALUES (%s, %s)"


def value(job: Job) -> object:
    return {"id": job.id, "attempt": job.attempt, "echo": job.payload}


def fenced(job: Job) -> object:
    with job.fenced() as conn:
        conn.execute(INSERT, (job.id, job.attempt))
    return {"fenced": job.attempt}


def none(job: Job) -> object:
    return None


def big(job: Job) -> object:
    return "x" * MAX_BYTES              # two quotes more than the limit


def nan(job: Job) -> object:
    return {"ratio": float("nan")}


def fenced_unstorable(job: Job) -> object:
    with job.fenced() as conn:
        conn.execute(INSERT, (job.id, job.attempt))
    return {"not json": object()}


async def avalue(job: AsyncJob) -> object:
    return {"id": job.id, "attempt": job.attempt, "echo": job.payload}


async def afenced(job: AsyncJob) -> object:
    async with job.fenced() as conn:
        await conn.execute(INSERT, (job.id, job.attempt))
    return {"fenced": job.attempt}


async def anone(job: AsyncJob) -> object:
    return None


async def abig(job: AsyncJob) -> object:
    return "x" * MAX_BYTES


async def anan(job: AsyncJob) -> object:
    return {"ratio": float("nan")}


async def afenced_unstorable(job: AsyncJob) -> object:
    async with job.fenced() as conn:
        await conn.execute(INSERT, (job.id, job.attempt))
    return {"not json": object()}


SYNC = {"value": value, "fenced": fenced, "none": none, "off": value, "big": big, "nan": nan,
        "fenced_unstorable": fenced_unstorable}
ASYNC = {"value": avalue, "fenced": afenced, "none": anone, "off": avalue, "big": abig, "nan": anan,
         "fenced_unstorable": afenced_unstorable}


def register(prefix: str, funcs: dict) -> None:
    from pgfence import handler

    for name, func in funcs.items():
        handler(f"{prefix}_{name}", result=name != "off")(func)
