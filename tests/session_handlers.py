"""Handlers for the tests of pgfence's own sessions (tests/test_sessions.py).

Loaded by worker processes with ``--handlers handlers.builtin,session_handlers``
(tests/ is on their PYTHONPATH); never registered in the test process.
"""

import time

from pgfence import handler


@handler("hold_row")
def hold_row(job):
    """Locks its own job's row inside its fenced() transaction, then works
    for payload.seconds without a statement: the session sits idle in
    transaction, holding the lock."""
    with job.fenced() as conn:
        conn.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE", (job.id,))
        deadline = time.monotonic() + float(job.payload.get("seconds", 0))
        while time.monotonic() < deadline:
            time.sleep(0.05)
