"""pgfence: a PostgreSQL job worker that fences every completion by attempt.

The handler API::

    from pgfence import handler, Job, AsyncJob, LeaseLost

The client API::

    from pgfence import enqueue, aenqueue, enqueue_many, get_job, aget_job, cancel, retry

The names are loaded on first use (PEP 562), so that ``pgfence run`` can set
up Prometheus's multiprocess directory before any module imports
prometheus_client.  Type checkers read the imports under ``TYPE_CHECKING``
below instead, so they see each name's real type, not ``Any``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgfence.asyncjob import AsyncJob
    from pgfence.client import JobInfo, aget_job, cancel, get_job, retry
    from pgfence.errors import (
        ConfigError,
        DatabaseError,
        DatabaseUnavailable,
        LeaseLost,
        PayloadRejected,
        PgfenceError,
        RateLimited,
        ResultRejected,
        SchemaMissing,
        StatementCanceled,
        TransactionConflict,
        UnknownHandler,
    )
    from pgfence.job import Job
    from pgfence.producer import aenqueue, enqueue, enqueue_many
    from pgfence.registry import handler, periodic

    #: The installed distribution's version.
    __version__: str

_EXPORTS = {
    "AsyncJob": "asyncjob",
    "JobInfo": "client",
    "aget_job": "client",
    "cancel": "client",
    "get_job": "client",
    "retry": "client",
    "ConfigError": "errors",
    "DatabaseError": "errors",
    "DatabaseUnavailable": "errors",
    "LeaseLost": "errors",
    "PayloadRejected": "errors",
    "PgfenceError": "errors",
    "RateLimited": "errors",
    "ResultRejected": "errors",
    "SchemaMissing": "errors",
    "StatementCanceled": "errors",
    "TransactionConflict": "errors",
    "UnknownHandler": "errors",
    "Job": "job",
    "aenqueue": "producer",
    "enqueue": "producer",
    "enqueue_many": "producer",
    "handler": "registry",
    "periodic": "registry",
}

# A literal list, so that type checkers read it as the package's exports.
__all__ = [
    "AsyncJob",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "Job",
    "JobInfo",
    "LeaseLost",
    "PayloadRejected",
    "PgfenceError",
    "RateLimited",
    "ResultRejected",
    "SchemaMissing",
    "StatementCanceled",
    "TransactionConflict",
    "UnknownHandler",
    "__version__",
    "aenqueue",
    "aget_job",
    "cancel",
    "enqueue",
    "enqueue_many",
    "get_job",
    "handler",
    "periodic",
    "retry",
]


def _version() -> str:
    # importlib.metadata, not a constant, so the version has one source
    # (pyproject.toml); a checkout that was never installed has no metadata.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pgfence")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    else:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'pgfence' has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
