"""The web dashboard (``pgfence web``; the ``web`` extra): queues, jobs and
their attempts, schedules, limits; retry, cancel, delete, pause, resume.

``create_app(dsn)`` returns the ASGI application, to serve or to mount in
another ASGI application (see the README's "Web dashboard").  It is
imported on first use, so that ``pgfence web`` can say in one line that
the extra is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgfence.web.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from pgfence.web.app import create_app

        return create_app
    raise AttributeError(f"module 'pgfence.web' has no attribute {name!r}")
