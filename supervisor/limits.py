"""Concurrency limits, the pure part: what a limit and a concurrency key may
be.  A kind's ``concurrency`` caps its jobs running at once across every
supervisor; its ``per_key_concurrency`` caps those of one concurrency key
(given at enqueue: ``concurrency_key="customer:42"``).  The database
enforces both (migration 0017: slots held by running attempts, admission
under the limit's row lock); :mod:`pgfence.admin.limits` reads and sets
them at run time, and ``@handler(concurrency=..., per_key_concurrency=...)``
declares them.
"""

from __future__ import annotations

from pgfence.errors import ConfigError

#: The longest concurrency key, in characters (the column's check).
KEY_MAX = 200
#: The largest limit: the column is a 32-bit integer.
LIMIT_MAX = 2**31 - 1


def check_limit(value: object, what: str) -> int | None:
    """``value`` as a limit (None: no limit); ConfigError unless it is a
    whole number from 1 to LIMIT_MAX."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"invalid {what}: must be a whole number, got {value!r}")
    if not 1 <= value <= LIMIT_MAX:
        raise ConfigError(f"invalid {what}: must be at least 1 (and at most {LIMIT_MAX}), got {value}")
    return value


def key_problem(key: object) -> str | None:
    """Why ``key`` is no concurrency key, or None."""
    if not isinstance(key, str):
        return f"invalid concurrency key: must be a string, got {key!r}"
    if not key:
        return "invalid concurrency key: must not be empty"
    if len(key) > KEY_MAX:
        return f"invalid concurrency key: at most {KEY_MAX} characters, got {len(key)}"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in key):
        return "invalid concurrency key: must hold no control character"
    return None


def check_key(key: object) -> str | None:
    """``key`` as a concurrency key (None: none); ConfigError otherwise."""
    if key is None:
        return None
    problem = key_problem(key)
    if problem:
        raise ConfigError(problem)
    assert isinstance(key, str)
    return key
