"""Celery 5 with the Redis broker, for the io section: tasks that wait
``PGFENCE_BENCH_IO_WAIT_MS`` (``io_sleep``: ``time.sleep``; ``io_http``: a GET
to the harness's delaying HTTP server), no result backend, each recording
its start and end (``drivers.redisclock``).

    python -m drivers.celery_io setup N TASK      # empty the broker's db, send N tasks
    python -m celery -A drivers.celery_io worker --pool threads -c 64 ...

The broker is ``PGFENCE_BENCH_CELERY_BROKER`` (redis://127.0.0.1:6379/11).
"""

from __future__ import annotations

import os
import sys
import time

from celery import Celery

from drivers import redisclock

URL = os.environ.get("PGFENCE_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/11")
WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000

app = Celery("pgfence_bench", broker=URL)
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False, worker_send_task_events=False)


@app.task(name="io_sleep")
def io_sleep() -> None:
    started = time.time()
    time.sleep(WAIT)
    redisclock.record(URL, started)


@app.task(name="io_http")
def io_http() -> None:
    from drivers.ioclient import get_sync

    started = time.time()
    if get_sync() != 200:
        raise RuntimeError("HTTP error")
    redisclock.record(URL, started)


def setup(n: int, task: str) -> None:
    redisclock.reset(URL)
    sig = app.tasks[task]
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            sig.apply_async(producer=producer)


if __name__ == "__main__":
    if sys.argv[1:2] != ["setup"]:
        raise SystemExit(__doc__)
    setup(int(sys.argv[2]), sys.argv[3])
