"""Fenced ORM writes: a task's writes through Django's ORM, committed in the
same transaction as its job's fenced completion, or not at all.

::

    @task
    def ship(order_id: int) -> None:
        label = carrier.label(order_id, key=current_job().idempotency_key)
        with fenced():                       # transaction.atomic() + the fence
            Shipment.objects.create(order_id=order_id, label=label)

    @task
    @fenced()                                # the whole body, fenced
    def record(order_id: int) -> None:
        Audit.objects.create(order_id=order_id)

    @task
    async def ship_async(order_id: int) -> None:
        await afenced(write_shipment, order_id)   # a def, run fenced on Django's thread

If the attempt running the task no longer owns its job (its lease ran out
and another worker took it), the block's writes are rolled back and
:class:`~pgfence.LeaseLost` is raised: the stale attempt leaves nothing
behind, and the refusal is counted as a double run prevented.  A task that
never enters a fenced block is completed (fenced) when it returns.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from contextlib import ContextDecorator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from asgiref.sync import sync_to_async
from django.db import transaction

from pgfence.contrib.django import connection
from pgfence.errors import LeaseLost, TransactionConflict
from pgfence.store import db, jobs

if TYPE_CHECKING:
    # Only for annotations: importing pgfence.job at run time would import
    # prometheus_client before `pgfence run` sets up its metrics folder.
    from pgfence.job import JobBase

T = TypeVar("T")

#: The job of the task running in this context, and its database alias.
_CURRENT: contextvars.ContextVar[tuple[JobBase, str] | None] = contextvars.ContextVar("pgfence_task_job",
                                                                                      default=None)


def current_job() -> JobBase | None:
    """The pgfence job of the task running here (its ``id``, ``attempt``,
    ``idempotency_key``, ``check()``), or None outside a task run by a
    pgfence worker."""
    found = _CURRENT.get()
    return None if found is None else found[0]


def bind(job: JobBase, alias: str) -> contextvars.Token[tuple[JobBase, str] | None]:
    """Make ``job`` the current task's job (the worker does, around a task)."""
    return _CURRENT.set((job, alias))


def unbind(token: contextvars.Token[tuple[JobBase, str] | None]) -> None:
    _CURRENT.reset(token)


def complete(job: JobBase, alias: str, result: str | None) -> None:
    """The fenced completion of ``job`` on Django's connection, inside the
    caller's atomic block: LeaseLost (after counting the refusal) when this
    attempt no longer owns the job; the caller's block then rolls back."""
    raw = connection.psycopg_connection(alias)
    try:
        with db.translated():
            done = jobs.complete(raw, job.id, job.attempt, result)
    except TransactionConflict as exc:
        job._conflicted(exc)   # raises
    if not done:
        job._rejected()
        raise LeaseLost(job.id, job.attempt, "fence_rejected")


def store_result(job: JobBase, alias: str, result: str) -> None:
    """Store the result of a job the task's own fenced block completed."""
    raw = connection.psycopg_connection(alias)
    with transaction.atomic(using=alias), db.translated():
        jobs.store_result(raw, job.id, job.attempt, result)


class fenced(ContextDecorator):  # noqa: N801 - used like transaction.atomic
    """``transaction.atomic()`` on the task's database whose commit carries
    the fenced completion of the task's job; also a decorator of a ``def``
    task's function."""

    def __init__(self) -> None:
        self._atomic: Any = None
        self._job: tuple[JobBase, str] | None = None

    def _recreate_cm(self) -> fenced:
        return type(self)()   # one block per call, also across threads

    def __call__(self, func: Callable[..., T]) -> Callable[..., T]:  # type: ignore[override]
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"fenced() cannot wrap the async function {func.__qualname__}: Django's ORM runs "
                            "on one thread for async code, so put the writes in a def function and call it "
                            "with 'await afenced(func, ...)'")
        return super().__call__(func)

    def __enter__(self) -> None:
        found = _CURRENT.get()
        if found is None:
            raise RuntimeError("fenced() is used inside a task run by a pgfence worker "
                               "(manage.py pgfence run); here no task is running")
        job, alias = found
        if job.completed:
            raise RuntimeError(f"job {job.id} is already completed: a task has one fenced block")
        self._job = found
        self._atomic = transaction.atomic(using=alias)
        self._atomic.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        assert self._job is not None
        job, alias = self._job
        if exc_type is not None:
            self._atomic.__exit__(exc_type, exc, tb)   # rolls back; never swallows
            return False
        try:
            complete(job, alias, None)
        except BaseException as failed:
            self._atomic.__exit__(type(failed), failed, failed.__traceback__)
            raise
        self._atomic.__exit__(None, None, None)
        job.completed = True
        return False


async def afenced(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the ``def`` function ``func(*args, **kwargs)`` inside
    :class:`fenced`, on Django's thread for synchronous work: the fenced
    ORM writes of an ``async def`` task."""
    if inspect.iscoroutinefunction(func):
        raise TypeError(f"afenced() runs a def function; {func.__qualname__} is async")

    def run() -> T:
        with fenced():
            return func(*args, **kwargs)

    return await sync_to_async(functools.partial(run), thread_sensitive=True)()
