"""Dramatiq 2 with the Redis broker, for the io section: actors that wait
``PGFENCE_BENCH_IO_WAIT_MS`` (``io_sleep``: ``time.sleep``; ``io_http``: a GET
to the harness's delaying HTTP server), no retries, each recording its start
and end (``drivers.redisclock``).

    python -m drivers.dramatiq_io setup N ACTOR   # empty the broker's db, send N messages
    python -m dramatiq drivers.dramatiq_io --processes 2 --threads 32

The broker is ``PGFENCE_BENCH_DRAMATIQ_BROKER`` (redis://127.0.0.1:6379/12).
"""

from __future__ import annotations

import os
import sys
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from drivers import redisclock

URL = os.environ.get("PGFENCE_BENCH_DRAMATIQ_BROKER", "redis://127.0.0.1:6379/12")
WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000

broker = RedisBroker(url=URL)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="io_sleep", max_retries=0)
def io_sleep() -> None:
    started = time.time()
    time.sleep(WAIT)
    redisclock.record(URL, started)


@dramatiq.actor(actor_name="io_http", max_retries=0)
def io_http() -> None:
    from drivers.ioclient import get_sync

    started = time.time()
    if get_sync() != 200:
        raise RuntimeError("HTTP error")
    redisclock.record(URL, started)


def setup(n: int, actor: str) -> None:
    redisclock.reset(URL)
    a = broker.get_actor(actor)
    for _ in range(n):
        a.send()


if __name__ == "__main__":
    if sys.argv[1:2] != ["setup"]:
        raise SystemExit(__doc__)
    setup(int(sys.argv[2]), sys.argv[3])
