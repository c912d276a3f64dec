"""pgfence as a Django tasks backend (``django.tasks`` on Django 6, the
``django-tasks`` package on Django 5.2)::

    # settings.py
    INSTALLED_APPS += ["pgfence.contrib.django"]
    TASKS = {"default": {"BACKEND": "pgfence.contrib.django.PgfenceBackend",
                         "QUEUES": ["default", "mail"],
                         "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 5}}}

    # myapp/tasks.py
    from django.tasks import task
    from pgfence.contrib.django import fenced

    @task
    def ship(order_id: int) -> None:
        with fenced():                          # the ORM writes commit with the
            Shipment.objects.create(order_id=order_id)   # completion, or not at all

Tasks are enqueued on Django's own connection (in the caller's
``transaction.atomic()``, if any), run by ``manage.py pgfence run`` as
pgfence handlers, and read back with ``get_result``.  The names below are
loaded on first use, so that ``INSTALLED_APPS`` can name this package
before Django's apps are ready.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgfence.contrib.django.backend import PgfenceBackend
    from pgfence.contrib.django.errors import TaskAbandoned, TaskCancelled
    from pgfence.contrib.django.fence import afenced, current_job, fenced

_EXPORTS = {
    "PgfenceBackend": "backend",
    "TaskAbandoned": "errors",
    "TaskCancelled": "errors",
    "afenced": "fence",
    "current_job": "fence",
    "fenced": "fence",
}

__all__ = ["PgfenceBackend", "TaskAbandoned", "TaskCancelled", "afenced", "current_job", "fenced"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgfence.contrib.django' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
