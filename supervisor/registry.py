"""The ``@handler`` decorator and the registry of job kinds.

Handler modules are found by import path (``--handlers mypkg.jobs,other``),
so users keep their handlers outside this repository.  Importing a module
registers its handlers as a side effect of the decorators.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import ConfigError, HandlerImportError, UnknownHandler

#: The modules loaded when no ``--handlers`` is given.
DEFAULT_MODULES = ("handlers.builtin", "handlers.receipts")


@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler and its options.

    ``lease`` and ``timeout`` are seconds (None: the worker's settings);
    ``max_attempts`` and ``max_reclaims`` are the defaults given to jobs of
    this kind enqueued through pgfence's Python API or CLI.
    """

    kind: str
    func: Callable
    queue: str | None = None
    lease: float | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    max_reclaims: int | None = None


_REGISTRY: dict[str, HandlerSpec] = {}


def handler(
    kind: str,
    *,
    queue: str | None = None,
    lease: float | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
    max_reclaims: int | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``func`` as the handler of jobs of ``kind``."""
    if not kind or not isinstance(kind, str):
        raise ConfigError("a handler needs a non-empty kind")
    for name, value in (("lease", lease), ("timeout", timeout)):
        if value is not None and value <= 0:
            raise ConfigError(f"handler {kind!r}: {name} must be positive, got {value}")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigError(f"handler {kind!r}: max_attempts must be at least 1, got {max_attempts}")
    if max_reclaims is not None and max_reclaims < 0:
        raise ConfigError(f"handler {kind!r}: max_reclaims must be 0 or more, got {max_reclaims}")

    def register(func: Callable) -> Callable:
        _REGISTRY[kind] = HandlerSpec(kind, func, queue, lease, timeout, max_attempts, max_reclaims)
        return func

    return register


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


def load(modules: Iterable[str]) -> list[str]:
    """Import handler modules by dotted path; return the kinds now known."""
    for name in modules:
        name = name.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ConfigError:
            raise
        except Exception as exc:  # an import can fail with any error at all
            detail = str(exc).strip().splitlines()
            detail_text = detail[0] if detail else ""
            raise HandlerImportError(
                f"cannot import handler module {name!r}: {type(exc).__name__}: {detail_text}"
            ) from None
    return kinds()
