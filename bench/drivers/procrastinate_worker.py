"""procrastinate through its public API: a no-op async task, enqueued with
``batch_defer_async`` and drained by ``App.run_worker_async(wait=False)``.

    python -m drivers.procrastinate_worker setup DSN N [TASK]
    python -m drivers.procrastinate_worker work DSN CONCURRENCY

TASK is ``noop`` (the default) or, for the io section, ``io_sleep``
(``asyncio.sleep`` of ``PGFENCE_BENCH_IO_WAIT_MS``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import procrastinate

WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="default")
    async def noop() -> None:
        """Does nothing, like pgfence's noop handler."""

    @app.task(name="io_sleep", queue="default")
    async def io_sleep() -> None:
        await asyncio.sleep(WAIT)

    return app


async def setup(dsn: str, n: int, name: str = "noop") -> None:
    async with make_app(dsn).open_async() as app:
        present = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present")
        if not present["present"]:
            await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
        task = app.tasks[name]
        chunk = 5_000
        for start in range(0, n, chunk):
            await task.batch_defer_async(*([{}] * min(chunk, n - start)))


async def work(dsn: str, concurrency: int) -> None:
    async with make_app(dsn).open_async() as app:
        await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    if argv[0] == "setup":
        asyncio.run(setup(argv[1], int(argv[2]), *argv[3:4]))
    elif argv[0] == "work":
        asyncio.run(work(argv[1], int(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
