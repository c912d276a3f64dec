"""procrastinate through its public API: a no-op async task, enqueued with
``batch_defer_async`` and drained by ``App.run_worker_async(wait=False)``.

    python -m drivers.procrastinate_worker setup DSN N
    python -m drivers.procrastinate_worker work DSN CONCURRENCY
"""

from __future__ import annotations

import asyncio
import logging
import sys

import procrastinate


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="default")
    async def noop() -> None:
        """Does nothing, like pgfence's noop handler."""

    return app


async def setup(dsn: str, n: int) -> None:
    async with make_app(dsn).open_async() as app:
        present = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present")
        if not present["present"]:
            await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
        task = app.tasks["noop"]
        chunk = 5_000
        for start in range(0, n, chunk):
            await task.batch_defer_async(*([{}] * min(chunk, n - start)))


async def work(dsn: str, concurrency: int) -> None:
    async with make_app(dsn).open_async() as app:
        await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    if argv[0] == "setup":
        asyncio.run(setup(argv[1], int(argv[2])))
    elif argv[0] == "work":
        asyncio.run(work(argv[1], int(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
