"""What the dashboard's pages show, computed without a server (and tested
so): the job list's filter from a query string, a job's attempts as lines,
times and ages as the templates write them, and the pages' sizes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, NamedTuple

from pgfence.store import web as store

#: Jobs per page of the list.
PAGE = 50


#: Up to this many rows of history (the catalog's estimate), the overview
#: counts finished jobs exactly; above, from a sample of about this many.
OVERVIEW_EXACT_ROWS = 200_000


#: The window of the overview's done and failed counts.
RECENT_SECONDS = 300.0


STATUSES = ("queued", "running", "done", "failed", "cancelled")


#: Why a queued job waits (its held_back), as the job page says it.
HELD_BACK = {"concurrency": "waiting for a concurrency slot", "scheduled": "held until its run_at"}


#: The job list's filters, as query parameters and form fields.
FILTERS = ("queue", "kind", "status", "id", "dedupe_key", "error")


def parse_filter(params: Mapping[str, Any]) -> tuple[store.JobFilter, list[str]]:
    """The job filter of query parameters or form fields (empty: not
    filtered on), and what was wrong in them (such a field is ignored)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name in FILTERS:
        raw = params.get(name)
        text = raw.strip() if isinstance(raw, str) else ""
        if not text:
            continue
        if name == "id":
            if not text.isdigit() or len(text) > 18:
                problems.append(f"id: not a job id: {text!r}")
                continue
            values["id"] = int(text)
        elif name == "status":
            if text not in STATUSES:
                problems.append(f"status: one of {', '.join(STATUSES)}, not {text!r}")
                continue
            values["status"] = text
        else:
            values[name] = text
    return store.JobFilter(**values), problems


def filter_fields(where: store.JobFilter) -> dict[str, str]:
    """The filter as query parameters or hidden fields (those set)."""
    return {name: str(value) for name, value in where._asdict().items() if value is not None}


def parse_id(text: object) -> int | None:
    if isinstance(text, str) and text.strip().isdigit() and len(text.strip()) <= 18:
        return int(text.strip())
    return None


class AttemptLine(NamedTuple):
    """One row of a job's attempt history."""

    attempt: int
    worker: str | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    #: done, error, lease_lost, fence_rejected, released, cancelled, timeout,
    #: running or queued.
    outcome: str
    detail: str | None


def attempt_lines(job: store.JobDetail, recorded: list[store.AttemptRow]) -> list[AttemptLine]:
    """The attempts recorded (those that did not simply succeed), then the
    job's own state: its successful last attempt, the one running now, the
    next one waiting, or a failure or cancel that left no row of its own."""
    lines = [AttemptLine(*row[:6]) for row in recorded]
    has_row = {row.attempt for row in recorded}
    if job.status == "done":
        lines.append(AttemptLine(job.attempt, job.worker, job.started_at, job.finished_at, "done", None))
    elif job.status == "running":
        lines.append(AttemptLine(job.attempt, job.worker, job.started_at, None, "running", None))
    elif job.status == "queued":
        waiting = f"waits until {job.run_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}Z" if job.run_at > job.now else None
        lines.append(AttemptLine(job.attempt + 1, None, None, None, "queued", waiting))
    elif job.attempt > 0 and job.attempt not in has_row:
        outcome = "cancelled" if job.status == "cancelled" else "error"
        lines.append(AttemptLine(job.attempt, job.worker, job.started_at, job.finished_at, outcome,
                                 job.last_error))
    return lines


def when(at: dt.datetime | None) -> str:
    """A time as the pages show it: UTC, to the second."""
    return "-" if at is None else f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}Z"


def age(seconds: float | None) -> str:
    """``3h 05m``, ``2m 07s``, ``12s``."""
    if seconds is None or seconds <= 0:
        return "-"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 24:
        return f"{hours // 24}d {hours % 24:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
