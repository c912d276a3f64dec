"""The Django tasks backend's statements (``sql/queries/tasks.sql``): one
task enqueued on Django's connection, its id and enqueue time in one round
trip; whether a done task's result is still being written.  Like the
other store modules, it neither translates driver errors nor retries."""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple, TypedDict

import psycopg

from pgfence.store.queries import q


class TaskParams(TypedDict):
    """The ``task_enqueue`` statement's parameters."""

    kind: str
    #: ``{"args": [...], "kwargs": {...}}`` as JSON text.
    payload: str
    queue: str
    priority: int
    run_at: datetime.datetime | None
    #: None: the kind's option, else pgfence's default.
    max_attempts: int | None


class Enqueued(NamedTuple):
    id: int
    enqueued_at: datetime.datetime


def enqueue(conn: psycopg.Connection[Any], params: TaskParams) -> Enqueued:
    """Enqueue one task's job in the caller's transaction."""
    if params["priority"] == 0 and params["run_at"] is None and params["max_attempts"] is None:
        row = conn.execute(q("task_enqueue_default"), (params["kind"], params["payload"], params["queue"])).fetchone()
    else:
        row = conn.execute(q("task_enqueue"), (params["kind"], params["payload"], params["queue"], params["priority"],
                                               params["run_at"], params["max_attempts"])).fetchone()
    if row is None:   # a SELECT of one function call always returns its row
        raise AssertionError("task_enqueue returned no row")
    return Enqueued(int(row[0]), row[1])


def result_pending(conn: psycopg.Connection[Any], job_id: int, grace: float) -> bool:
    """Whether the done task ``job_id``'s result is still to be written (its
    fenced block completed the job less than ``grace`` seconds ago)."""
    row = conn.execute(q("task_result_pending"), {"id": job_id, "grace": grace}).fetchone()
    return bool(row and row[0])
