"""Handlers for the tests of periodic jobs under real supervisors
(tests/test_periodic_run.py).

The functions here register nothing: each test writes a small module of its
own to its tmp folder that registers them under the kinds and schedules it
needs (``handler("slow_skip", every=1, ...)(record_run)``), so that the
supervisors of one test declare that test's schedules alone.

``record_run`` writes its start and its end to ``periodic_test.runs`` (the
test creates that table) at once, on the database's clock, so a test can
tell whether two runs of one schedule ever overlapped.
"""

from __future__ import annotations

import os
import time

from pgfence import Job

#: The table ``record_run`` writes (created by the test).
RUNS_TABLE = """
    CREATE SCHEMA periodic_test;
    CREATE TABLE periodic_test.runs (
        job_id  bigint      NOT NULL,
        attempt integer     NOT NULL,
        phase   text        NOT NULL CHECK (phase IN ('start', 'end')),
        at      timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (job_id, attempt, phase))"""

_RECORD = "INSERT INTO periodic_test.runs (job_id, attempt, phase) VALUES (%s, %s, %s)"


def _record(job: Job, phase: str) -> None:
    with job.borrow() as conn:
        conn.execute(_RECORD, (job.id, job.attempt, phase))


def record_run(job: Job) -> None:
    """Records its start; works ``payload.seconds`` (default 0), then, if
    ``payload.file`` is given, until that file exists; records its end."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    _record(job, "start")
    deadline = time.monotonic() + float(payload.get("seconds", 0))
    while time.monotonic() < deadline:
        job.check()
        time.sleep(0.02)
    flag = payload.get("file")
    while flag is not None and not os.path.exists(flag):
        job.check()
        time.sleep(0.02)
    _record(job, "end")


def noop(job: Job) -> None:
    """Does nothing."""


def always_fails(job: Job) -> None:
    """Raises at every attempt."""
    raise RuntimeError(f"periodic run {job.scheduled_for} fails on purpose")
