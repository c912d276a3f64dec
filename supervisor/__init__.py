"""pgfence: a PostgreSQL job worker that fences every completion by attempt.

The handler API::

    from pgfence import handler, Job, LeaseLost

The names are loaded on first use (PEP 562), so that ``pgfence run`` can set
up Prometheus's multiprocess directory before any module imports
prometheus_client.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "errors",
    "DatabaseError": "errors",
    "DatabaseUnavailable": "errors",
    "LeaseLost": "errors",
    "PayloadRejected": "errors",
    "PgfenceError": "errors",
    "SchemaMissing": "errors",
    "StatementCanceled": "errors",
    "TransactionConflict": "errors",
    "UnknownHandler": "errors",
    "Job": "job",
    "enqueue": "producer",
    "handler": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
