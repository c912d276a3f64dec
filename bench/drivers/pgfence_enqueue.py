"""pgfence's producer API, timed for the enqueue section; run by the
project's interpreter (pgfence is not in bench/.venv), from bench/:

    python -m drivers.pgfence_enqueue enqueue DSN N          # enqueue(conn, ...), one job per transaction
    python -m drivers.pgfence_enqueue insert DSN N           # the bare INSERT ... RETURNING id round trip
    python -m drivers.pgfence_enqueue many DSN N BATCH       # enqueue_many(conn, jobs), BATCH per transaction
    python -m drivers.pgfence_enqueue aenqueue DSN N [CONC]  # aenqueue(aconn, ...) on CONC connections (1)

Every connection is an autocommit one, so a one-job call is its own
transaction; enqueue_many runs in ``conn.transaction()``.  Job i's payload
is ``{"i": i}``, built before the clock starts; the calls, and whatever each
makes of it (pgfence's JSON, the bare loop's ``json.dumps``), are timed.
Prints one JSON line (drivers.enqueue_clock).
"""

from __future__ import annotations

import asyncio
import json
import sys

import psycopg

from drivers.enqueue_clock import Clock, report
from pgfence import aenqueue, enqueue, enqueue_many

KIND = "noop"
INSERT = "INSERT INTO pgfence.jobs (kind, payload) VALUES (%s, %s) RETURNING id"
WARM = 100


def one(dsn: str, n: int, mode: str) -> dict:
    payloads = [{"i": i} for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        if mode == "enqueue":
            def call(p: dict) -> object:
                return enqueue(conn, KIND, p)
        else:
            def call(p: dict) -> object:
                return conn.execute(INSERT, (KIND, json.dumps(p))).fetchone()
        for p in payloads[:WARM]:      # past psycopg's prepare threshold (5)
            call(p)
        clock = Clock(dsn)
        clock.start()
        for p in payloads:
            call(p)
        return clock.stop(n)


def many(dsn: str, n: int, batch: int) -> dict:
    payloads = [{"i": i} for i in range(n)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(6):
            with conn.transaction():
                enqueue_many(conn, [{"kind": KIND, "payload": p} for p in payloads[:100]])
        clock = Clock(dsn)
        clock.start()
        got = 0
        for start in range(0, n, batch):
            with conn.transaction():
                got += len(enqueue_many(conn, [{"kind": KIND, "payload": p} for p in payloads[start:start + batch]]))
        return clock.stop(got, calls=-(-n // batch))


async def aone(dsn: str, n: int, conc: int) -> dict:
    payloads = [{"i": i} for i in range(n)]
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(conc)]
    try:
        for c in conns:
            for p in payloads[:WARM // conc + 6]:
                await aenqueue(c, KIND, p)

        async def loop(c: psycopg.AsyncConnection, part: list[dict]) -> None:
            for p in part:
                await aenqueue(c, KIND, p)

        clock = Clock(dsn)
        clock.start()
        await asyncio.gather(*(loop(c, payloads[k::conc]) for k, c in enumerate(conns)))
        return clock.stop(n, connections=conc)
    finally:
        for c in conns:
            await c.close()


def main(argv: list[str]) -> None:
    mode, dsn, n = argv[0], argv[1], int(argv[2])
    if mode in ("enqueue", "insert"):
        report(one(dsn, n, mode))
    elif mode == "many":
        report(many(dsn, n, int(argv[3])))
    elif mode == "aenqueue":
        report(asyncio.run(aone(dsn, n, int(argv[3]) if len(argv) > 3 else 1)))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
