"""Valid queue and kind names.

A name is 1 to 128 characters: ASCII letters, digits, ``_``, ``.``, ``:`` and
``-``, starting with a letter or a digit.  Nothing else can be served for
sure: ``--queues`` splits on commas and strips spaces, and the settings read
``none`` as "no value", so a job on the queue ``' padded'``, ``'a,b'`` or
``none`` would wait for ever.  ``none`` (in any case) is therefore no queue
name.  Migration 0008 applies the same rule to every row inserted into
pgfence.jobs, whoever the producer.
"""

from __future__ import annotations

import re

from pgfence.errors import ConfigError

#: The pattern every queue and kind name matches (also in 0008_names.sql).
PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
MAX_LENGTH = 128

_NAME = re.compile(PATTERN)
_RULE = f"1 to {MAX_LENGTH} letters, digits, '_', '.', ':' or '-', starting with a letter or a digit"


def problem(name: object, what: str) -> str | None:
    """Why ``name`` is no valid name for a ``what`` ("queue" or "kind"), or
    None when it is one."""
    if not isinstance(name, str):
        return f"invalid {what} name {name!r}: must be a string"
    if not _NAME.fullmatch(name):
        return f"invalid {what} name {name!r}: must be {_RULE}"
    if what == "queue" and name.lower() == "none":
        return f"invalid queue name {name!r}: 'none' means no value in settings, so no worker could serve it"
    return None


def check(name: object, what: str) -> str:
    """``name`` itself when it is valid, else ConfigError."""
    found = problem(name, what)
    if found:
        raise ConfigError(found)
    return name  # type: ignore[return-value]
