"""pgfence: a PostgreSQL job worker that fences every completion by attempt.

The handler API::

    from supervisor import handler, Job, LeaseLost
"""

from .errors import (
    ConfigError,
    DatabaseUnavailable,
    LeaseLost,
    PayloadRejected,
    PgfenceError,
    SchemaMissing,
    UnknownHandler,
)
from .job import Job
from .producer import enqueue
from .registry import handler

__all__ = [
    "ConfigError",
    "DatabaseUnavailable",
    "Job",
    "LeaseLost",
    "PayloadRejected",
    "PgfenceError",
    "SchemaMissing",
    "UnknownHandler",
    "enqueue",
    "handler",
]
