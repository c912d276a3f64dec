"""The demo's statements (``demo.sql`` beside this module)."""

from __future__ import annotations

from typing import NamedTuple

import psycopg

from pgfence.store.queries import queries_in

q = queries_in("pgfence.tools.demo", "demo.sql")


class DemoJob(NamedTuple):
    status: str
    attempt: int
    locked_by: str | None


def job(conn: psycopg.Connection, job_id: int) -> DemoJob | None:
    """One job's state as the demo reports it; None if there is no such job."""
    row = conn.execute(q("demo_job"), {"id": job_id}).fetchone()
    return None if row is None else DemoJob._make(row)


def receipts(conn: psycopg.Connection, job_id: int) -> list[int]:
    """The attempts that committed a receipt for the job, in commit order."""
    return [attempt for (attempt,) in conn.execute(q("demo_receipts"), {"id": job_id})]
