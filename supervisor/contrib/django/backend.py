"""``PgfenceBackend``: Django's task backend API on pgfence's jobs.

A task is a job whose kind is the task's module path
(``myapp.tasks.send_receipt``) and whose payload is
``{"args": [...], "kwargs": {...}}``, enqueued on Django's own connection
(``OPTIONS["DATABASE"]``, default ``"default"``): inside
``transaction.atomic()`` it commits or rolls back with the caller's writes.
Django's priority (-100 to 100, higher first) is pgfence's priority as it
is; ``run_after`` is the job's ``run_at``.  A result's id is the job's id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core import checks
from django.utils.module_loading import import_string

from pgfence import names
from pgfence.client import get_job
from pgfence.contrib.django import compat, connection, results
from pgfence.errors import ConfigError
from pgfence.store import db
from pgfence.store import tasks as store

#: The payload of a task enqueued with no arguments.
NO_ARGUMENTS = '{"args":[],"kwargs":{}}'
#: Tasks whose validation is remembered, at most (then it starts again).
VALID_CACHE = 1024

#: Seconds after a task's fenced block completed its job during which a
#: missing result is one its worker has still to write (the task is shown
#: RUNNING meanwhile); after them, the result is taken as lost.
RESULT_GRACE = 60.0

#: The OPTIONS the backend reads, with their defaults.
OPTIONS = {"DATABASE": "default", "MAX_ATTEMPTS": None, "TASK_MODULES": ()}


class PgfenceBackend(compat.BaseTaskBackend):
    """Django's task backend on pgfence: defer, async tasks, results and
    priority all supported."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise compat.InvalidTaskBackend(f"pgfence tasks backend {alias!r}: unknown OPTIONS "
                                            f"{', '.join(sorted(unknown))} (known: {', '.join(OPTIONS)})")
        self.database: str = self.options.get("DATABASE", "default")
        self.max_attempts: int | None = self.options.get("MAX_ATTEMPTS")
        self.task_modules: tuple[str, ...] = tuple(self.options.get("TASK_MODULES", ()))
        #: The tasks validated, and their kinds (see _kind_of).
        self._valid: dict[Any, str] = {}

    # -- validation ---------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """Django's own rules, then pgfence's: the task's path must be a
        valid kind name and its queue a valid queue name."""
        super().validate_task(task)
        problem = names.problem(task.module_path, "kind") or names.problem(task.queue_name, "queue")
        if problem:
            raise compat.InvalidTask(f"task {task.module_path!r}: {problem}")

    def _kind_of(self, task: Any) -> str:
        """``task`` validated, and its kind: once per task (a Task is frozen,
        so what validation read cannot change; one with a run_after, whose
        check reads USE_TZ, is validated at every enqueue)."""
        if task.run_after is not None:
            self.validate_task(task)
            return str(task.module_path)
        kind = self._valid.get(task)
        if kind is None:
            self.validate_task(task)
            if len(self._valid) >= VALID_CACHE:
                self._valid.clear()
            kind = self._valid[task] = task.module_path
        return kind

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """Django check messages: the database, the options, the queues."""
        yield from super().check(**kwargs)
        from django.apps import apps

        problem = connection.problem(self.database)
        if problem:
            yield checks.Error(f"pgfence tasks backend {self.alias!r}: {problem}", id="pgfence.E001")
        if not apps.is_installed("pgfence.contrib.django"):
            yield checks.Error(f"pgfence tasks backend {self.alias!r}: its app is not installed",
                               hint="Add 'pgfence.contrib.django' to INSTALLED_APPS (it migrates pgfence's "
                                    "schema and adds manage.py pgfence)", id="pgfence.E002")
        for queue in sorted(self.queues):
            problem = names.problem(queue, "queue")
            if problem:
                yield checks.Error(f"pgfence tasks backend {self.alias!r}: {problem}", id="pgfence.E003")
        if self.max_attempts is not None and (not isinstance(self.max_attempts, int) or self.max_attempts < 1):
            yield checks.Error(f"pgfence tasks backend {self.alias!r}: MAX_ATTEMPTS must be a whole number of "
                               f"at least 1, got {self.max_attempts!r}", id="pgfence.E004")

    # -- enqueue ------------------------------------------------------------

    def _params(self, task: Any, args: Any, kwargs: Any) -> tuple[store.TaskParams, list[Any], dict[str, Any]]:
        kind = self._kind_of(task)
        if args or kwargs:
            args = compat.normalize_json(list(args))
            kwargs = compat.normalize_json(dict(kwargs))
            payload = json.dumps({"args": args, "kwargs": kwargs}, allow_nan=False, separators=(",", ":"))
        else:
            args, kwargs, payload = [], {}, NO_ARGUMENTS
        return (store.TaskParams(kind=kind, payload=payload, queue=task.queue_name,
                                 priority=task.priority, run_at=task.run_after, max_attempts=self.max_attempts),
                args, kwargs)

    def _new_result(self, task: Any, enqueued: store.Enqueued, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return compat.TaskResult(task=task, id=str(enqueued.id), status=compat.TaskResultStatus.READY,
                                 enqueued_at=enqueued.enqueued_at, started_at=None, finished_at=None,
                                 last_attempted_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
                                 worker_ids=[])

    def _insert(self, task: Any, args: Any, kwargs: Any) -> Any:
        params, args, kwargs = self._params(task, args, kwargs)
        conn = connection.psycopg_connection(self.database)
        with db.translated():
            enqueued = store.enqueue(conn, params)
        return self._new_result(task, enqueued, args, kwargs)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Enqueue ``task`` on Django's connection, in the caller's
        transaction; its TaskResult (READY).  Arguments that JSON cannot
        carry raise TypeError, and a task Django or pgfence refuses
        InvalidTask, before anything is written."""
        result = self._insert(task, args, kwargs)
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """:meth:`enqueue` from async code (Django's connection is reached
        through its one thread for synchronous work)."""
        result = await sync_to_async(self._insert, thread_sensitive=True)(task, args, kwargs)
        await compat.task_enqueued.asend(type(self), task_result=result)
        return result

    # -- results ------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The TaskResult of the job ``result_id``; TaskResultDoesNotExist
        when there is no such job (or it is not a task's)."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise compat.TaskResultDoesNotExist(result_id) from None
        if job_id < 1 or str(job_id) != str(result_id).strip():
            raise compat.TaskResultDoesNotExist(result_id)
        conn = connection.psycopg_connection(self.database)
        try:
            info = get_job(conn, job_id)
        except ConfigError:
            raise compat.TaskResultDoesNotExist(result_id) from None
        if info is None:
            raise compat.TaskResultDoesNotExist(result_id)
        try:
            task = import_string(info.kind)
        except ImportError:
            raise compat.TaskResultDoesNotExist(f"{result_id}: job {job_id} is of kind {info.kind!r}, which "
                                                "names no task") from None
        if not isinstance(task, compat.task_classes()):
            raise compat.TaskResultDoesNotExist(f"{result_id}: job {job_id} is of kind {info.kind!r}, which "
                                                "is not a task")
        pending = info.status == "done" and info.result is None and store.result_pending(conn, job_id, RESULT_GRACE)
        return results.task_result(info, task, self.alias, connection.json_reader(conn), pending=pending)

    async def aget_result(self, result_id: str) -> Any:
        """:meth:`get_result` from async code."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)



def pgfence_backends() -> dict[str, PgfenceBackend]:
    """The configured task backends that are pgfence's, by alias."""
    found = {}
    for alias in compat.task_backends.settings:
        backend = compat.task_backends[alias]
        if isinstance(backend, PgfenceBackend):
            found[alias] = backend
    return found
