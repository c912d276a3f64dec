"""pgqueuer through its public API: a no-op async entrypoint, drained by
``PgQueuer.run(batch_size=..., mode=drain)`` on the asyncpg or psycopg driver.

    python -m drivers.pgqueuer_worker setup DSN N
    python -m drivers.pgqueuer_worker work DSN {apg|psy} BATCH
"""

from __future__ import annotations

import asyncio
import sys

from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, PsycopgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "noop"


async def connect(dsn: str, driver: str):
    if driver == "apg":
        import asyncpg

        return AsyncpgDriver(await asyncpg.connect(dsn=dsn))
    if driver == "psy":
        import psycopg

        return PsycopgDriver(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
    raise SystemExit(f"unknown driver {driver!r}")


async def setup(dsn: str, n: int) -> None:
    queries = Queries(await connect(dsn, "apg"))
    if not await queries.has_table("pgqueuer"):
        await queries.install()
    await queries.clear_queue()
    await queries.clear_statistics_log()
    await queries.driver.execute("TRUNCATE pgqueuer_log")
    chunk = 10_000
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)


async def work(dsn: str, driver: str, batch: int) -> None:
    pgq = PgQueuer(await connect(dsn, driver))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Does nothing, like pgfence's noop handler."""

    await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)


def main(argv: list[str]) -> None:
    if argv[0] == "setup":
        asyncio.run(setup(argv[1], int(argv[2])))
    elif argv[0] == "work":
        try:
            import uvloop
            uvloop.run(work(argv[1], argv[2], int(argv[3])))
        except ImportError:
            asyncio.run(work(argv[1], argv[2], int(argv[3])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
