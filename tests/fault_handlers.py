"""Handlers for tests that need a job to reach the fence late.

Loaded by worker processes with ``--handlers handlers.builtin,fault_handlers``
(tests/ is on their PYTHONPATH); never registered in the test process.
"""

import os
import time

from pgfence import handler
from pgfence.handlers.tables import INSERT_EFFECT


@handler("stubborn")
def stubborn(job):
    """Writes its effect in its fenced transaction, then works there for
    payload.seconds without ever looking at its lease, so that a late attempt
    meets the fence itself."""
    seconds = float(job.payload.get("seconds", 0))
    with job.fenced() as conn:
        conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                     "key": job.idempotency_key, "worker": str(os.getpid())})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
