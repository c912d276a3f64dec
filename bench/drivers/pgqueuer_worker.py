"""pgqueuer through its public API: a no-op async entrypoint, drained by
``PgQueuer.run(batch_size=..., mode=drain)`` on the asyncpg or psycopg driver.

    python -m drivers.pgqueuer_worker setup DSN N [ENTRYPOINT]
    python -m drivers.pgqueuer_worker work DSN {apg|psy} BATCH [ENTRYPOINT [MAX_CONCURRENT_TASKS]]
    python -m drivers.pgqueuer_worker serve DSN {apg|psy} BATCH

work drains the queue and exits; serve (the soak section) runs the no-op
entrypoint in pgqueuer's continuous mode until SIGTERM.

ENTRYPOINT is ``noop`` (the default), or for the io section ``io_sleep``
(``asyncio.sleep`` of ``PGFENCE_BENCH_IO_WAIT_MS``) or ``io_http`` (a GET to
the harness's delaying HTTP server, ``drivers.ioclient``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, PsycopgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "noop"
WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000


async def connect(dsn: str, driver: str):
    if driver == "apg":
        import asyncpg

        return AsyncpgDriver(await asyncpg.connect(dsn=dsn))
    if driver == "psy":
        import psycopg

        return PsycopgDriver(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
    raise SystemExit(f"unknown driver {driver!r}")


async def setup(dsn: str, n: int, entrypoint: str = ENTRYPOINT) -> None:
    queries = Queries(await connect(dsn, "apg"))
    if not await queries.has_table("pgqueuer"):
        await queries.install()
    await queries.clear_queue()
    await queries.clear_statistics_log()
    await queries.driver.execute("TRUNCATE pgqueuer_log")
    chunk = 10_000
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        await queries.enqueue([entrypoint] * size, [None] * size, [0] * size)


async def work(dsn: str, driver: str, batch: int, entrypoint: str = ENTRYPOINT,
               max_concurrent: int | None = None, mode: QueueExecutionMode = QueueExecutionMode.drain) -> None:
    pgq = PgQueuer(await connect(dsn, driver))
    # SIGTERM ends a continuous run the way pgqueuer's own shutdown does.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pgq.shutdown.set)

    if entrypoint == "noop":
        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            """Does nothing, like pgfence's noop handler."""
    elif entrypoint == "io_sleep":
        @pgq.entrypoint("io_sleep")
        async def io_sleep(job: Job) -> None:
            await asyncio.sleep(WAIT)
    elif entrypoint == "io_http":
        from drivers.ioclient import get_async

        @pgq.entrypoint("io_http")
        async def io_http(job: Job) -> None:
            if await get_async() != 200:
                raise RuntimeError("HTTP error")
    else:
        raise SystemExit(f"unknown entrypoint {entrypoint!r}")

    await pgq.run(batch_size=batch, mode=mode, max_concurrent_tasks=max_concurrent)


def main(argv: list[str]) -> None:
    if argv[0] == "setup":
        asyncio.run(setup(argv[1], int(argv[2]), *argv[3:4]))
    elif argv[0] in ("work", "serve"):
        entrypoint = argv[4] if len(argv) > 4 else ENTRYPOINT
        most = int(argv[5]) if len(argv) > 5 else None
        mode = QueueExecutionMode.drain if argv[0] == "work" else QueueExecutionMode.continuous
        coro = work(argv[1], argv[2], int(argv[3]), entrypoint, most, mode)
        try:
            import uvloop
        except ImportError:
            asyncio.run(coro)
        else:
            uvloop.run(coro)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
