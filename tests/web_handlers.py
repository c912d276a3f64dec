"""Handlers for the dashboard's browser tests (tests/test_web_browser.py).

Loaded by their workers with ``--handlers pgfence.handlers.builtin,web_handlers``
(tests/ is on their PYTHONPATH); never registered in the test process.
"""

import os
import time

from pgfence import handler
from pgfence.handlers.tables import INSERT_EFFECT


@handler("flaky")
def flaky(job):
    """Fails on its first ``payload.failures`` attempts (default 2), then
    succeeds: its attempt history reads error, error, done."""
    failures = int(job.payload.get("failures", 2))
    if job.attempt <= failures:
        raise RuntimeError(f"flaky: attempt {job.attempt} fails on purpose")


@handler("hold")
def hold(job):
    """Writes its effect in its fenced transaction, then stays there until
    its lease is known lost (an operator's cancel, learnt at the next
    renewal) or ``payload.seconds`` pass, and leaves the block: its
    completion meets the fence, which refuses it and rolls the effect back."""
    deadline = time.monotonic() + float(job.payload.get("seconds", 60))
    with job.fenced() as conn:
        conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                     "key": job.idempotency_key, "worker": str(os.getpid())})
        while not job.lease_lost and time.monotonic() < deadline:
            time.sleep(0.02)
