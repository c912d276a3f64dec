"""The task API of the Django in use: ``django.tasks`` (Django 6.0 and
later) or the ``django-tasks`` package (the backport Django 5.2 sites use).

Both have the same classes and signals; the backport names its exception
``InvalidTaskError``.  Everything is looked up once here, so the rest of
the backend never asks which one it is.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def _package() -> tuple[str, ModuleType]:
    for name in ("django.tasks", "django_tasks"):
        try:
            return name, importlib.import_module(name)
        except ImportError:
            continue
    raise ImproperlyConfigured("pgfence.contrib.django needs Django 6.0 or later (django.tasks), or the "
                               "django-tasks package on Django 5.2: pip install 'pgfence[django]'")


PACKAGE, _tasks = _package()
_base: Any = importlib.import_module(f"{PACKAGE}.base")
_backends: Any = importlib.import_module(f"{PACKAGE}.backends.base")
_exceptions: Any = importlib.import_module(f"{PACKAGE}.exceptions")
_signals: Any = importlib.import_module(f"{PACKAGE}.signals")

Task: Any = _base.Task
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskError: Any = _base.TaskError
TaskContext: Any = _base.TaskContext
BaseTaskBackend: Any = _backends.BaseTaskBackend
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
InvalidTaskBackend: Any = getattr(_exceptions, "InvalidTaskBackend", None) or _exceptions.InvalidTaskBackendError
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
task_backends: Any = _tasks.task_backends


def _normalize() -> Any:
    try:
        return importlib.import_module("django.utils.json").normalize_json
    except (ImportError, AttributeError):
        return importlib.import_module("django_tasks.utils").normalize_json


#: Django's JSON normalisation of args, kwargs and return values: tuples
#: become lists, mappings dicts; anything JSON cannot hold raises TypeError.
normalize_json: Any = _normalize()


def task_classes() -> tuple[type, ...]:
    """Every Task class a project may declare tasks with (on Django 6 with
    the backport installed too, both)."""
    found: list[type] = [Task]
    if PACKAGE == "django.tasks":
        with contextlib.suppress(ImportError):
            found.append(importlib.import_module("django_tasks.base").Task)
    return tuple(found)
