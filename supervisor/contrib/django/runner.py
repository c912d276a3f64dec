"""Django tasks run as pgfence handlers.

:func:`register_all` finds the tasks of the project (the ``tasks`` module
of every installed app, and the modules a backend names in
``OPTIONS["TASK_MODULES"]``) whose backend is pgfence's, and registers each
as the handler of the kind named by its module path: a ``def`` task runs on
a worker thread, an ``async def`` task on the worker's event loop.

Around each task the worker does what Django does around a request:
``close_old_connections()`` before and after (and ``reset_queries()``
under DEBUG), for an async task on Django's thread for synchronous work.
It sends ``task_started`` before the task and ``task_finished`` once the
outcome is known (successful once the completion committed; failed on the
attempt that has no retry left).  The return value goes through Django's
JSON normalisation and is stored as the job's result by the fenced
completion, on Django's connection.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import socket
import traceback
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.db import close_old_connections, reset_queries, transaction
from django.utils import timezone

from pgfence import registry, results
from pgfence.asyncjob import AsyncJob
from pgfence.contrib.django import compat, fence
from pgfence.contrib.django.backend import pgfence_backends
from pgfence.contrib.django.errors import TaskExited
from pgfence.errors import ResultRejected
from pgfence.job import Job, JobBase

log = logging.getLogger("pgfence.django")

#: This process, as a running task's TaskResult names its worker.
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _task_modules(backends: dict[str, Any]) -> list[str]:
    modules = [f"{config.name}.tasks" for config in apps.get_app_configs()]
    for backend in backends.values():
        modules.extend(m for m in backend.task_modules if m not in modules)
    return modules


def _import(name: str, required: bool) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not required and exc.name is not None and name.startswith(exc.name):
            return None   # the app has no tasks module
        raise


def _is_task(value: Any, classes: tuple[type, ...], backends: dict[str, Any]) -> bool:
    return isinstance(value, classes) and getattr(value, "backend", None) in backends


def discover() -> dict[str, Any]:
    """Every task of the project on a pgfence backend, by kind."""
    backends = pgfence_backends()
    named = {m for b in backends.values() for m in b.task_modules}
    found: dict[str, Any] = {}
    classes = compat.task_classes()
    for name in _task_modules(backends):
        module = _import(name, required=name in named)
        if module is None:
            continue
        for value in vars(module).values():
            if _is_task(value, classes, backends):
                found.setdefault(value.module_path, value)
    return found


def register_all() -> list[str]:
    """Register every task :func:`discover` finds as a pgfence handler;
    the kinds registered."""
    found = discover()
    for kind, task in found.items():
        backend = compat.task_backends[task.backend]
        run = _async_handler(task, backend) if inspect.iscoroutinefunction(task.func) else _handler(task, backend)
        registry.handler(kind, queue=task.queue_name)(run)
    return sorted(found)


def _running(job: JobBase, task: Any, backend: Any) -> Any:
    """The TaskResult of ``job``'s attempt as it starts: RUNNING."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    now = timezone.now()
    return compat.TaskResult(task=task, id=str(job.id), status=compat.TaskResultStatus.RUNNING, enqueued_at=None,
                             started_at=now, finished_at=None, last_attempted_at=now,
                             args=list(payload.get("args") or []), kwargs=dict(payload.get("kwargs") or {}),
                             backend=backend.alias, errors=[], worker_ids=[_WORKER] * job.attempt)


def _call_args(task: Any, result: Any) -> tuple[list[Any], dict[str, Any]]:
    args = list(result.args)
    if task.takes_context:
        args.insert(0, compat.TaskContext(task_result=result))
    return args, result.kwargs


def _exited(exc: BaseException) -> TaskExited:
    """The task's own SystemExit or KeyboardInterrupt, as its error (no
    signal raises either into a task: a worker child ignores SIGINT, and a
    second Ctrl-C ends ``pgfence work`` at once)."""
    kind = type(exc)
    return TaskExited(f"{kind.__module__}.{kind.__qualname__}: {exc}")


def _call(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return task.func(*args, **kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _exited(exc) from exc


def _final(job: JobBase, exc: BaseException) -> bool:
    """Whether ``exc`` ends the task FAILED: its last attempt raised, or its
    result cannot be stored."""
    return job.attempt >= job.max_attempts or isinstance(exc, ResultRejected)


def _encode(value: object) -> str:
    """The JSON text of a task's return value: always some text (``null``
    for None), so a done job without one is a result still being written."""
    try:
        value = compat.normalize_json(value)
    except TypeError as exc:
        raise ResultRejected(f"the task's return value is not JSON serializable: {exc}") from exc
    return results.encode(value) or "null"


def _finish(job: JobBase, alias: str, text: str) -> None:
    """Complete ``job`` through the fence on Django's connection with its
    result, or store the result of a job the task's fenced block completed."""
    if job.completed:
        fence.store_result(job, alias, text)
        return
    with transaction.atomic(using=alias):
        fence.complete(job, alias, text)
    job.completed = True


def _settle(result: Any, status: str, exc: BaseException | None = None) -> None:
    object.__setattr__(result, "status", compat.TaskResultStatus[status])
    object.__setattr__(result, "finished_at", timezone.now())
    if exc is not None:
        kind = type(exc)
        result.errors.append(compat.TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                                              traceback="".join(traceback.format_exception(exc))))


def _db_turn() -> None:
    close_old_connections()
    if settings.DEBUG:
        reset_queries()


def _handler(task: Any, backend: Any) -> Any:
    alias = backend.database

    def run(job: Job) -> None:
        result = _running(job, task, backend)
        _db_turn()
        token = fence.bind(job, alias)
        try:
            compat.task_started.send(sender=type(backend), task_result=result)
            args, kwargs = _call_args(task, result)
            value = _call(task, args, kwargs)
            text = _encode(value)
            _finish(job, alias, text)
        except BaseException as exc:
            if _final(job, exc):
                _settle(result, "FAILED", exc)
                compat.task_finished.send(sender=type(backend), task_result=result)
            raise
        finally:
            fence.unbind(token)
            _db_turn()
        object.__setattr__(result, "_return_value", json.loads(text))
        _settle(result, "SUCCESSFUL")
        compat.task_finished.send(sender=type(backend), task_result=result)

    run.__qualname__ = run.__name__ = f"task:{task.module_path}"
    return run


def _async_handler(task: Any, backend: Any) -> Any:
    alias = backend.database
    db_turn = sync_to_async(_db_turn, thread_sensitive=True)
    finish = sync_to_async(_finish, thread_sensitive=True)

    async def run(job: AsyncJob) -> None:
        result = _running(job, task, backend)
        await db_turn()
        token = fence.bind(job, alias)
        try:
            await compat.task_started.asend(sender=type(backend), task_result=result)
            args, kwargs = _call_args(task, result)
            try:
                value = await task.func(*args, **kwargs)
            except (SystemExit, KeyboardInterrupt) as exc:
                raise _exited(exc) from exc
            text = _encode(value)
            await finish(job, alias, text)
        except BaseException as exc:
            if _final(job, exc):
                _settle(result, "FAILED", exc)
                await compat.task_finished.asend(sender=type(backend), task_result=result)
            raise
        finally:
            fence.unbind(token)
            await db_turn()
        object.__setattr__(result, "_return_value", json.loads(text))
        _settle(result, "SUCCESSFUL")
        await compat.task_finished.asend(sender=type(backend), task_result=result)

    run.__qualname__ = run.__name__ = f"task:{task.module_path}"
    return run
