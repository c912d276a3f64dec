"""A pgfence job as Django's ``TaskResult``: its status, timestamps,
args and kwargs, return value, errors and the workers of its attempts.

========================  ===========================================
pgfence status            TaskResultStatus
========================  ===========================================
queued                    READY (also between a failed attempt and the next)
running                   RUNNING
done                      SUCCESSFUL (``return_value``: the stored result);
                          RUNNING while the result of a task whose
                          fenced block completed its job is written
failed, cancelled         FAILED (``errors`` says why)
========================  ===========================================

``worker_ids`` has one entry per attempt started, so ``attempts`` (and
``TaskContext.attempt``) count pgfence's attempts.  ``errors`` has one
``TaskError`` per attempt that raised or timed out, with the exception's
class path and traceback as the worker recorded them; a cancelled job ends
with :class:`~pgfence.contrib.django.TaskCancelled`, and a job failed by
its lease lost too often with :class:`~pgfence.contrib.django.TaskAbandoned`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from pgfence.client import JobInfo
from pgfence.contrib.django import compat

STATUS = {"queued": "READY", "running": "RUNNING", "done": "SUCCESSFUL", "failed": "FAILED", "cancelled": "FAILED"}

_HEADER = "Traceback (most recent call last):"
_EXITED = "pgfence.contrib.django.errors.TaskExited"


def exception_line(traceback: str) -> str:
    """The line of ``traceback`` that names the exception raised last
    (``module.Class: message``): the first unindented line after the last
    ``Traceback`` header, or the first line of a traceback that has none."""
    lines = traceback.splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith(_HEADER)]
    for line in lines[starts[-1] + 1 if starts else 0:]:
        if line and not line[0].isspace():
            return line
    return ""


def class_path(text: str) -> str:
    """The exception's class path from its line (``ValueError: no`` ->
    ``builtins.ValueError``, ``shop.errors.Declined: card`` as it is):
    Python names a builtin exception without its module."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if name in (_EXITED, "TaskExited"):    # SystemExit or KeyboardInterrupt, carried
        return class_path(rest)
    if not name or " " in name:
        return "builtins.Exception"
    if "." not in name:
        return f"builtins.{name}" if isinstance(getattr(builtins, name, None), type) else f"__main__.{name}"
    return name


def _error(exc_path: str, traceback: str) -> Any:
    return compat.TaskError(exception_class_path=exc_path, traceback=traceback)


def errors(info: JobInfo) -> list[Any]:
    """One TaskError per attempt that raised or timed out, then one for a
    cancel or an abandon that ended the job."""
    found = []
    for attempt in info.attempts:
        if attempt.outcome not in ("error", "timeout"):
            continue
        traceback = attempt.traceback or attempt.detail or ""
        line = exception_line(traceback) if attempt.traceback else (attempt.detail or "")
        found.append(_error(class_path(line), traceback if traceback.endswith("\n") else traceback + "\n"))
    if info.status == "cancelled":
        detail = next((a.detail for a in reversed(info.attempts) if a.outcome == "cancelled"), None)
        found.append(_error("pgfence.contrib.django.errors.TaskCancelled",
                            f"pgfence.contrib.django.errors.TaskCancelled: {detail or 'cancelled'}\n"))
    elif info.status == "failed" and not found:
        found.append(_error("pgfence.contrib.django.errors.TaskAbandoned",
                            f"pgfence.contrib.django.errors.TaskAbandoned: {info.last_error or 'failed'}\n"))
    return found


def worker_ids(info: JobInfo) -> list[str]:
    """The worker of each attempt started, in order: from the attempts'
    records, and the job's worker for the last one."""
    by_attempt = {a.attempt: a.worker for a in info.attempts if a.worker}
    if info.worker:
        by_attempt.setdefault(info.attempt, info.worker)
    return [by_attempt.get(n) or "" for n in range(1, info.attempt + 1)]


def task_result(info: JobInfo, task: Any, backend: str, read_json: Callable[[Any], Any], *,
                pending: bool = False) -> Any:
    """The TaskResult of the job ``info`` of ``task``; its payload and
    result read by ``read_json`` (see connection.json_reader).  ``pending``:
    the job is done but its result is still being written (the task's
    fenced block committed, the task has not returned yet), so it is shown
    RUNNING until the result is there."""
    payload = read_json(info.payload)
    payload = payload if isinstance(payload, dict) else {}
    status = compat.TaskResultStatus["RUNNING" if pending else STATUS[info.status]]
    result = compat.TaskResult(
        task=task, id=str(info.id), status=status, enqueued_at=info.created_at,
        started_at=info.started_at, finished_at=info.finished_at if info.finished and not pending else None,
        last_attempted_at=info.started_at, args=list(payload.get("args") or []),
        kwargs=dict(payload.get("kwargs") or {}), backend=backend, errors=errors(info),
        worker_ids=worker_ids(info))
    if info.status == "done" and not pending:
        object.__setattr__(result, "_return_value", read_json(info.result))
    return result
