"""Read, cancel and retry jobs from Python, on the caller's connection and
in its transaction (enqueueing is :mod:`pgfence.producer`'s)::

    job = get_job(conn, job_id)               # or: await aget_job(aconn, job_id)
    job.status, job.attempt, job.attempts, job.last_error

    cancel(conn, [job_id])                    # the ids it cancelled
    retry(conn, [job_id])                     # RetryResult(requeued, skipped)

A job is read wherever it is, live in ``pgfence.jobs`` or finished in
history (``pgfence.all_jobs``), with its recorded attempts from
``pgfence.job_attempts``.  The operator commands (``pgfence cancel``,
``pgfence retry``, the dashboard) run these same functions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, NamedTuple

import psycopg

from pgfence.errors import ConfigError
from pgfence.store import admin as admin_store
from pgfence.store import client as store
from pgfence.store import db
from pgfence.store import web as web_store


#: One attempt of a job that did not simply succeed, as
#: ``pgfence.job_attempts`` records it: ``attempt``, ``worker``,
#: ``started_at``, ``ended_at``, ``outcome`` (``error``, ``timeout``,
#: ``lease_lost``, ``fence_rejected``, ``released`` or ``cancelled``) and
#: ``detail`` (the error's text, or what happened).
Attempt = web_store.AttemptRow


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """A job as :func:`get_job` reads it."""

    id: int
    kind: str
    queue: str
    #: ``queued``, ``running``, ``done``, ``failed`` or ``cancelled``.
    status: str
    payload: Any
    priority: int
    #: The attempts started so far (the fencing token of the last one).
    attempt: int
    max_attempts: int
    reclaims: int
    dedupe_key: str | None
    created_at: dt.datetime
    run_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    #: The running job's owner, or the worker of a finished job's last attempt.
    worker: str | None
    last_error: str | None
    last_traceback: str | None
    #: Every attempt that did not simply succeed, in order.
    attempts: tuple[Attempt, ...]
    #: What the handler returned, once the job is done (JSON: dicts, lists,
    #: strings, numbers); None while it is not, or when nothing was stored
    #: (the handler returned None, or its kind says ``result=False``).
    result: Any = None
    #: The key its kind's per-key concurrency limit counts it under (a
    #: live job's; history keeps none).
    concurrency_key: str | None = None
    #: Why a queued job waits for a concurrency slot: ``concurrency`` (its
    #: kind's or its key's slots are all held) or ``scheduled`` (its run_at
    #: is still to come); None when it does not wait on a limit.
    held_back: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the job has ended (done, failed or cancelled)."""
        return self.status in ("done", "failed", "cancelled")

    @property
    def errors(self) -> list[str]:
        """The errors of the attempts that raised or timed out, in order."""
        return [a.detail or "" for a in self.attempts if a.outcome in ("error", "timeout")]


def _job_id(job_id: object) -> int:
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
        raise ConfigError(f"invalid job id: must be a positive whole number, got {job_id!r}")
    return job_id


def _info(found: store.FoundJob | None) -> JobInfo | None:
    if found is None:
        return None
    job, attempts = found
    return JobInfo(id=job.id, kind=job.kind, queue=job.queue, status=job.status, payload=job.payload,
                   priority=job.priority, attempt=job.attempt, max_attempts=job.max_attempts,
                   reclaims=job.reclaims, dedupe_key=job.dedupe_key, created_at=job.created_at,
                   run_at=job.run_at, started_at=job.started_at, finished_at=job.finished_at, worker=job.worker,
                   last_error=job.last_error, last_traceback=job.last_traceback,
                   attempts=tuple(attempts), result=job.result, concurrency_key=job.concurrency_key,
                   held_back=job.held_back)


def get_job(conn: psycopg.Connection[Any], job_id: int) -> JobInfo | None:
    """The job ``job_id``, live or finished, with its recorded attempts;
    None when there is no such job (never enqueued, deleted, or dropped
    with its history partition)."""
    job_id = _job_id(job_id)
    with db.translated():
        return _info(store.get_job(conn, job_id))


async def aget_job(aconn: psycopg.AsyncConnection[Any], job_id: int) -> JobInfo | None:
    """:func:`get_job` on a ``psycopg.AsyncConnection``."""
    job_id = _job_id(job_id)
    with db.translated():
        return _info(await store.aget_job(aconn, job_id))


class RetryResult(NamedTuple):
    """What ``retry`` did: the jobs queued again, and the jobs skipped as
    ``(id, holder)`` because the job ``holder`` holds their dedupe key."""

    requeued: list[int]
    skipped: list[tuple[int, int | None]]


def retry(conn: psycopg.Connection[Any], ids: list[int] | None, *, failed: bool = False,
          extra_attempts: int = 1) -> RetryResult:
    """Queue failed or cancelled jobs again (``ids``, or with ``failed``
    every failed job), each with ``extra_attempts`` more attempts.

    A job whose dedupe key a live job of its kind holds is skipped and
    reported, and the others are queued all the same; of several candidates
    sharing one key, only the oldest is queued.  A producer that enqueues a
    job with such a key while this runs can still break the dedupe index
    (the statement saw no live holder): the statement is then run again,
    and it skips that job.
    """
    for job_id in ids or []:
        _job_id(job_id)
    verdicts: list[admin_store.RetryVerdict] = []
    with db.translated():
        for tries in range(1, 4):
            try:
                with conn.transaction():
                    verdicts = admin_store.retry(conn, ids or [], all_failed=failed, extra_attempts=extra_attempts)
                break
            except psycopg.errors.UniqueViolation:
                if tries == 3:
                    raise
    return RetryResult(requeued=[v.id for v in verdicts if v.requeued],
                       skipped=[(v.id, v.holder) for v in verdicts if not v.requeued])


def cancel(conn: psycopg.Connection[Any], ids: list[int]) -> list[int]:
    """Cancel queued or running jobs (a running job's attempt finds its
    lease gone and its completion refused); the ids that were cancelled,
    sorted."""
    for job_id in ids:
        _job_id(job_id)
    with db.translated():
        return admin_store.cancel_ids(conn, ids)
