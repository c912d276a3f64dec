"""The errors a task's result lists for what was not an exception of the
task's own: ``TaskResult.errors[i].exception_class`` resolves to one of
these."""

from __future__ import annotations

from pgfence.errors import PgfenceError


class TaskCancelled(PgfenceError):
    """The task's job was cancelled (``pgfence cancel``, the dashboard, or
    :func:`pgfence.cancel`) before it finished."""


class TaskAbandoned(PgfenceError):
    """The task's job failed without an error of its own: its lease was lost
    (a worker killed or frozen while running it) on its last attempt, or
    more often than its ``max_reclaims`` allow."""


class TaskExited(PgfenceError):
    """The task raised ``SystemExit`` or ``KeyboardInterrupt`` (``exit()``
    in a task, say): an error of the task, not a reason for the worker to
    stop.  Its message starts with the class path of what was raised, which
    the task's result lists as the error's class."""
