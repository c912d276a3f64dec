"""pgfence handlers for the benchmark's io section, ``def`` handlers (run on
a worker child's threads: ``pgfence run --threads T``).  Each waits
``PGFENCE_BENCH_IO_WAIT_MS`` (50 by default):

- ``io_sleep``: ``time.sleep``; writes nothing;
- ``io_http``: a GET to the harness's delaying HTTP server
  (``PGFENCE_BENCH_HTTP_PORT``), which answers after that wait; writes nothing;
- ``io_row``: ``time.sleep``, then one row through the fence
  (``job.fenced_writes()``, as the built-in ``effect`` handler).

Loaded as ``--handlers bench.drivers.pgfence_io_sync`` from the repository
root (pgfence imports handler modules with the current directory first).
The async counterparts are in :mod:`bench.drivers.pgfence_io_async`.
"""

from __future__ import annotations

import os
import time

from pgfence import Job, handler
from pgfence.handlers.tables import INSERT_EFFECT

from bench.drivers.ioclient import get_sync

WAIT = float(os.environ.get("PGFENCE_BENCH_IO_WAIT_MS", "50")) / 1000


@handler("io_sleep")
def io_sleep(job: Job) -> None:
    time.sleep(WAIT)


@handler("io_http")
def io_http(job: Job) -> None:
    status = get_sync()
    if status != 200:
        raise RuntimeError(f"HTTP {status}")


@handler("io_row")
def io_row(job: Job) -> None:
    time.sleep(WAIT)
    with job.fenced_writes() as writes:
        writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                       "key": job.idempotency_key, "worker": str(os.getpid())})
