"""Handlers that misbehave in ways a worker must survive, or be restarted
from with care.  Loaded by worker processes with
``--handlers handlers.builtin,poison_handlers`` (tests/ is on their
PYTHONPATH); never registered in the test process."""

import os

from pgfence import handler


@handler("poison_error")
def poison_error(job):
    """Raises an error whose text PostgreSQL cannot store as it is: a NUL
    byte and a lone surrogate (bytes decoded with surrogateescape)."""
    raise ValueError("bad \x00 byte and " + b"caf\xe9".decode("utf-8", "surrogateescape"))


@handler("exit_hard")
def exit_hard(job):
    """Leaves the worker process at once, as a crash in a C extension would."""
    os._exit(7)
