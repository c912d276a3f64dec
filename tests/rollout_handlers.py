"""Handlers of a kind that only the new release of a rolling deploy knows,
and one that fails its first attempt.

Loaded by worker processes with ``--handlers handlers.builtin,rollout_handlers``
(tests/ is on their PYTHONPATH); never registered in the test process.
"""

from pgfence import handler


@handler("new_kind")
def new_kind(job):
    """Does nothing: the worker completes it through the fence."""


@handler("fail_first")
def fail_first(job):
    """Fails its first attempt, succeeds on the next."""
    if job.attempt == 1:
        raise RuntimeError("the first attempt fails on purpose")
