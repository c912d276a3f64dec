"""The peers' enqueue calls, timed for the enqueue section, each through its
public API as its documentation shows it; run by bench/.venv's interpreter:

    python -m drivers.enqueue_peers pgqueuer-setup DSN
    python -m drivers.enqueue_peers pgqueuer-one DSN N            # Queries.enqueue(entrypoint, payload), one a call
    python -m drivers.enqueue_peers pgqueuer-batch DSN N BATCH    # Queries.enqueue([...], [...], [...]), BATCH a call
    python -m drivers.enqueue_peers procrastinate-setup DSN
    python -m drivers.enqueue_peers procrastinate-defer DSN N     # Task.defer(**kwargs), app.open() (sync)
    python -m drivers.enqueue_peers procrastinate-batch DSN N BATCH          # Task.batch_defer(*kwargs)
    python -m drivers.enqueue_peers procrastinate-defer-async DSN N          # await Task.defer_async(**kwargs)
    python -m drivers.enqueue_peers procrastinate-batch-async DSN N BATCH    # await Task.batch_defer_async(*kwargs)
    python -m drivers.enqueue_peers celery-delay URL N            # task.delay(i), Redis broker (the db flushed first)

pgqueuer on its asyncpg driver (one connection); procrastinate on its
PsycopgConnector (its own pool); Celery 5 with no result backend.  Job i's
payload is ``{"i": i}``, built before the clock starts: pgqueuer takes
bytes, so its JSON encoding is timed with its calls; procrastinate and
Celery encode the keyword arguments themselves.  Every call is its own
transaction (its own round trip for Celery).  Prints one JSON line
(drivers.enqueue_clock).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from drivers.enqueue_clock import Clock, report

WARM = 100


# -- pgqueuer ------------------------------------------------------------------------------


async def _pgqueuer(dsn: str):
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    return Queries(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))


async def pgqueuer_setup(dsn: str) -> None:
    queries = await _pgqueuer(dsn)
    if not await queries.has_table("pgqueuer"):
        await queries.install()


async def pgqueuer_run(dsn: str, n: int, batch: int) -> dict:
    queries = await _pgqueuer(dsn)
    payloads = [{"i": i} for i in range(n)]
    if batch == 1:
        for p in payloads[:WARM]:
            await queries.enqueue("noop", json.dumps(p).encode())
    else:
        for _ in range(6):
            await queries.enqueue(["noop"] * 100, [json.dumps(p).encode() for p in payloads[:100]], [0] * 100)
    clock = Clock(dsn)
    clock.start()
    got = 0
    if batch == 1:
        for p in payloads:
            got += len(await queries.enqueue("noop", json.dumps(p).encode()))
    else:
        for start in range(0, n, batch):
            part = payloads[start:start + batch]
            got += len(await queries.enqueue(["noop"] * len(part), [json.dumps(p).encode() for p in part],
                                             [0] * len(part)))
    return clock.stop(got)


# -- procrastinate -------------------------------------------------------------------------


def _procrastinate_app(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="default")
    def noop(i: int) -> None:
        """Does nothing: only its enqueue is measured."""

    return app, noop


async def procrastinate_setup(dsn: str) -> None:
    app, _ = _procrastinate_app(dsn)
    async with app.open_async():
        present = await app.connector.execute_query_one_async(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present")
        if not present["present"]:
            await app.schema_manager.apply_schema_async()


def procrastinate_sync(dsn: str, n: int, batch: int) -> dict:
    app, task = _procrastinate_app(dsn)
    payloads = [{"i": i} for i in range(n)]
    with app.open():
        if batch == 1:
            for p in payloads[:WARM]:
                task.defer(**p)
        else:
            for _ in range(6):
                task.batch_defer(*payloads[:100])
        clock = Clock(dsn)
        clock.start()
        got = 0
        if batch == 1:
            for p in payloads:
                task.defer(**p)
                got += 1
        else:
            for start in range(0, n, batch):
                got += len(task.batch_defer(*payloads[start:start + batch]))
        return clock.stop(got)


async def procrastinate_async(dsn: str, n: int, batch: int) -> dict:
    app, task = _procrastinate_app(dsn)
    payloads = [{"i": i} for i in range(n)]
    async with app.open_async():
        if batch == 1:
            for p in payloads[:WARM]:
                await task.defer_async(**p)
        else:
            for _ in range(6):
                await task.batch_defer_async(*payloads[:100])
        clock = Clock(dsn)
        clock.start()
        got = 0
        if batch == 1:
            for p in payloads:
                await task.defer_async(**p)
                got += 1
        else:
            for start in range(0, n, batch):
                got += len(await task.batch_defer_async(*payloads[start:start + batch]))
        return clock.stop(got)


# -- Celery --------------------------------------------------------------------------------


def celery_delay(url: str, n: int) -> dict:
    import redis
    from celery import Celery

    redis.Redis.from_url(url).flushdb()
    app = Celery("pgfence_bench_enqueue", broker=url)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)

    @app.task(name="noop")
    def noop(i: int) -> None:
        """Does nothing: only its enqueue is measured."""

    payloads = [{"i": i} for i in range(n)]
    for p in payloads[:WARM]:
        noop.delay(**p)
    clock = Clock(None)
    clock.start()
    for p in payloads:
        noop.delay(**p)
    result = clock.stop(n)
    queued = redis.Redis.from_url(url).llen("celery")
    if queued != n + WARM:
        raise SystemExit(f"celery: {queued} messages in the broker's queue, {n + WARM} sent")
    return result


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    mode, target = argv[0], argv[1]
    n = int(argv[2]) if len(argv) > 2 else 0
    batch = int(argv[3]) if len(argv) > 3 else 1
    if mode == "pgqueuer-setup":
        asyncio.run(pgqueuer_setup(target))
    elif mode in ("pgqueuer-one", "pgqueuer-batch"):
        report(asyncio.run(pgqueuer_run(target, n, batch)))
    elif mode == "procrastinate-setup":
        asyncio.run(procrastinate_setup(target))
    elif mode in ("procrastinate-defer", "procrastinate-batch"):
        report(procrastinate_sync(target, n, batch))
    elif mode in ("procrastinate-defer-async", "procrastinate-batch-async"):
        report(asyncio.run(procrastinate_async(target, n, batch)))
    elif mode == "celery-delay":
        report(celery_delay(target, n))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
