"""Kinds for tests/test_rate_limited.py: attempt 1 is refused by the
service it calls (RateLimited, retry after 0.5s); a later attempt writes one
effect row through its fenced block.  ``<p>_limited`` has no limit of its
own, ``<p>_rated`` a rate of 100/s (closed by the 429 until its
retry_after).  Registered by ratelimited_sync_handlers.py (def),
ratelimited_async_handlers.py (async def) and ratelimited_mixed_handlers.py
(both); loaded by ``pgfence run`` children only."""

from __future__ import annotations

from pgfence import AsyncJob, Job, RateLimited, handler

INSERT = "INSERT INTO rl.effects (job_id, attempt) VALUES (%s, %s)"
RETRY_AFTER = 0.5


def sync(job: Job) -> None:
    if job.payload.get("refuse") and job.attempt == 1:
        raise RateLimited(RETRY_AFTER, "the mail service answered 429")
    with job.fenced() as conn:
        conn.execute(INSERT, (job.id, job.attempt))


async def asynchronous(job: AsyncJob) -> None:
    if job.payload.get("refuse") and job.attempt == 1:
        raise RateLimited(RETRY_AFTER, "the mail service answered 429")
    async with job.fenced() as conn:
        await conn.execute(INSERT, (job.id, job.attempt))


def register(prefix: str, func: object) -> None:
    handler(f"{prefix}_limited", max_attempts=1)(func)        # type: ignore[arg-type]
    handler(f"{prefix}_rated", max_attempts=1, rate="100/s")(func)  # type: ignore[arg-type]
