"""The ``@handler`` decorator and the registry of job kinds.

Handler modules are found by import path (``--handlers mypkg.jobs,other``),
so users keep their handlers outside this repository; none is loaded by
default (``pgfence.handlers`` holds examples, loaded only when named).  Importing a module
registers its handlers as a side effect of the decorators.  Like celery and
gunicorn, :func:`load` imports from the current directory too.

A handler is a ``def`` function (run on one of the worker's threads, given a
:class:`~pgfence.Job`) or an ``async def`` function (run on the worker's
event loop, given an :class:`~pgfence.AsyncJob`).  An async generator
function is refused when it is registered: calling it runs nothing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pgfence import bounds, limits, names
from pgfence.errors import ConfigError, HandlerImportError, UnknownHandler
from pgfence.scheduling.schedule import CATCH_UP_WINDOW, Schedule

if TYPE_CHECKING:
    # Only for annotations: importing pgfence.job at run time would import
    # prometheus_client before `pgfence run` sets up its multiprocess folder.
    from collections.abc import Awaitable

    from pgfence.asyncjob import AsyncJob
    from pgfence.job import Job

#: A handler: called with the Job (an AsyncJob for an ``async def``
#: handler), its return value ignored.  ``@handler`` returns the function it
#: is given, so the decorated name keeps its type.
H = TypeVar("H", bound="Callable[[Job], object] | Callable[[AsyncJob], Awaitable[object]]")

@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler and its options.

    ``lease`` and ``timeout`` are seconds (None: the worker's settings);
    ``max_attempts`` and ``max_reclaims`` are the defaults given to jobs of
    this kind enqueued through pgfence's Python API or CLI.
    """

    kind: str
    func: Callable[..., object]
    queue: str | None = None
    lease: float | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    max_reclaims: int | None = None
    #: An ``async def`` handler: run on the worker's event loop.
    is_async: bool = False
    #: Store the handler's return value as its job's result (pgfence.results).
    store_result: bool = True
    #: At most this many jobs of the kind at once, across every supervisor.
    concurrency: int | None = None
    #: At most this many at once of one concurrency key of the kind.
    per_key_concurrency: int | None = None
    #: At most this many starts a period, e.g. ``"100/s"`` (pgfence.limits.parse_rate).
    rate: str | None = None


_REGISTRY: dict[str, HandlerSpec] = {}
#: Schedules declared in code (``@handler(cron=...)``, :func:`periodic`), by name.
_SCHEDULES: dict[str, Schedule] = {}


def handler(
    kind: str,
    *,
    queue: str | None = None,
    lease: float | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
    max_reclaims: int | None = None,
    cron: str | None = None,
    every: float | None = None,
    tz: str = "UTC",
    payload: object = None,
    overlap: str = "skip",
    catch_up: str = "latest",
    catch_up_window: float = CATCH_UP_WINDOW,
    result: bool = True,
    concurrency: int | None = None,
    per_key_concurrency: int | None = None,
    rate: str | None = None,
) -> Callable[[H], H]:
    """Register the decorated function as the handler of jobs of ``kind``
    and return it unchanged.

    What the handler returns is stored as its job's result (JSON, up to
    :data:`pgfence.results.MAX_BYTES`; read it with :func:`pgfence.get_job`);
    ``result=False`` stores nothing.

    With ``cron`` (an expression in ``tz``) or ``every`` (seconds, at least
    one), jobs of ``kind`` are also enqueued periodically, with ``payload``,
    by a schedule named after the kind (see :func:`periodic`).

    ``concurrency``: at most that many jobs of ``kind`` run at once, across
    every supervisor; ``per_key_concurrency``: at most that many of one
    ``concurrency_key`` (given at enqueue); ``rate``: at most that many
    start a period (``"100/s"``, ``"10/min"``), across every supervisor, on
    the database clock.  They are recorded in the database when a worker
    starts, where ``pgfence limits set`` may change
    them at run time."""
    if not kind or not isinstance(kind, str):
        raise ConfigError("a handler needs a non-empty kind")
    names.check(kind, "kind")
    if queue is not None:
        try:
            names.check(queue, "queue")
        except ConfigError as exc:
            raise ConfigError(f"handler {kind!r}: {exc}") from None
    for name, value in (("lease", lease), ("timeout", timeout)):
        if value is not None:
            bounds.check(name, value, label=f"{name} of handler {kind!r}")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigError(f"handler {kind!r}: max_attempts must be at least 1, got {max_attempts}")
    if max_reclaims is not None and max_reclaims < 0:
        raise ConfigError(f"handler {kind!r}: max_reclaims must be 0 or more, got {max_reclaims}")
    try:
        limits.check_limit(concurrency, "concurrency")
        limits.check_limit(per_key_concurrency, "per_key_concurrency")
        limits.parse_rate(rate)
    except ConfigError as exc:
        raise ConfigError(f"handler {kind!r}: {exc}") from None

    def register(func: H) -> H:
        if is_async_generator(func):
            raise ConfigError(f"handler {kind!r} ({_name_of(func)}) is an async generator; calling it runs "
                              "nothing: define it with async def and no yield, or with def")
        _REGISTRY[kind] = HandlerSpec(kind, func, queue, lease, timeout, max_attempts, max_reclaims,
                                      is_async=is_async(func), store_result=bool(result),
                                      concurrency=concurrency, per_key_concurrency=per_key_concurrency,
                                      rate=rate)
        return func

    if cron is not None or every is not None:
        periodic(kind, kind, cron=cron, every=every, tz=tz, payload=payload, overlap=overlap, catch_up=catch_up,
                 catch_up_window=catch_up_window)

    return register


def periodic(
    name: str,
    kind: str,
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str = "UTC",
    payload: object = None,
    queue: str | None = None,
    overlap: str = "skip",
    catch_up: str = "latest",
    catch_up_window: float = CATCH_UP_WINDOW,
) -> Schedule:
    """Declare a schedule: a job of ``kind`` with ``payload`` at each tick of
    ``cron`` (in ``tz``) or ``every`` seconds, on ``queue`` (None: the kind's).

    ``overlap``: ``skip`` (a tick whose previous run is still queued or
    running is recorded as skipped), ``allow`` or ``queue`` (runs after the
    previous one ends).  ``catch_up`` after a time no supervisor ran:
    ``latest`` (the most recent missed tick, once), ``none``, or ``all``
    (those within ``catch_up_window`` seconds).  An invalid expression,
    time zone or option raises ConfigError at once (``pgfence run`` prints
    one line and exits 2)."""
    schedule = Schedule(name, kind, cron=cron, every=every, tz=tz, payload=payload,  # type: ignore[arg-type]
                        queue=queue, overlap=overlap, catch_up=catch_up, catch_up_window=catch_up_window)
    _SCHEDULES[name] = schedule
    return schedule


def schedules() -> list[Schedule]:
    """The schedules declared in code, by name."""
    return [_SCHEDULES[n] for n in sorted(_SCHEDULES)]


def forget_schedules() -> None:
    """Drop the schedules declared in code (before handler modules are
    imported again on reload: one removed from them must enqueue nothing
    more)."""
    _SCHEDULES.clear()


def is_async(func: Callable[..., object]) -> bool:
    """Whether calling ``func`` returns a coroutine or an async generator
    instead of running it: an ``async def`` function, a
    ``functools.partial`` of one, or an object whose ``__call__`` is one.

    A synchronous wrapper of an async function (one that runs it with
    ``asyncio.run``) is synchronous, so ``__wrapped__`` is not followed.
    """
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        return True
    if inspect.isfunction(func) or inspect.ismethod(func) or inspect.isclass(func) or inspect.isbuiltin(func):
        return False
    # An instance: what runs is its class's __call__.
    call = type(func).__call__
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def is_async_generator(func: Callable[..., object]) -> bool:
    """Whether ``func`` (or the function a partial wraps, or an instance's
    ``__call__``) is an async generator function."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.isasyncgenfunction(func):
        return True
    if inspect.isfunction(func) or inspect.ismethod(func) or inspect.isclass(func) or inspect.isbuiltin(func):
        return False
    return inspect.isasyncgenfunction(type(func).__call__)


def has_async() -> bool:
    """Whether any registered handler is ``async def``: a worker then runs
    an event loop."""
    return any(spec.is_async for spec in _REGISTRY.values())


def _name_of(func: Callable[..., object]) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    module = getattr(func, "__module__", None) or type(func).__module__
    return f"{module}.{name}"


def unserved(queues: Iterable[str]) -> list[HandlerSpec]:
    """The registered handlers whose jobs go to a queue not in ``queues``
    (a handler without a queue option puts its jobs on ``default``)."""
    served = set(queues)
    return [s for s in specs() if (s.queue or "default") not in served]


def get(kind: str) -> HandlerSpec:
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownHandler(f"unknown job kind {kind!r} (known: {known})") from None


def find(kind: str) -> HandlerSpec | None:
    return _REGISTRY.get(kind)


def kinds() -> list[str]:
    return sorted(_REGISTRY)


def specs() -> list[HandlerSpec]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def _cwd_on_path() -> None:
    """Put the current directory at the front of ``sys.path``, as celery and
    gunicorn do, so that ``--handlers myjobs`` finds ``./myjobs.py`` whether
    pgfence was started as a console script (whose ``sys.path[0]`` is the
    script's own folder) or with ``python -m``."""
    try:
        cwd = os.getcwd()
    except OSError:   # the directory was removed under us: nothing to add
        return
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def load(modules: Iterable[str]) -> list[str]:
    """Import handler modules by dotted path (the current directory first);
    return the kinds now known."""
    _cwd_on_path()
    for name in modules:
        name = name.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - an import can fail with any error at all
            detail = str(exc).strip().splitlines()
            detail_text = detail[0] if detail else ""
            raise HandlerImportError(
                f"cannot import handler module {name!r}: {type(exc).__name__}: {detail_text}"
            ) from None
    return kinds()
