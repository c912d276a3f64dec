"""Concurrency and rate limits, the pure part: what a limit, a rate and a
concurrency key may be.  A kind's ``concurrency`` caps its jobs running at
once across every supervisor; its ``per_key_concurrency`` caps those of one
concurrency key (given at enqueue: ``concurrency_key="customer:42"``); its
``rate`` (``"100/s"``, ``"10/min"``) caps how many start per period, on the
database clock.  The database
enforces both (migration 0017: slots held by running attempts, admission
under the limit's row lock); :mod:`pgfence.admin.limits` reads and sets
them at run time, and ``@handler(concurrency=..., per_key_concurrency=...)``
declares them.
"""

from __future__ import annotations

import re

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


#: The units a rate's period may be given in, in seconds.
RATE_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
              "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0,
              "days": 86400.0}
_RATE = re.compile(r"\s*(\d{1,10})\s*/\s*(\d{1,6}(?:\.\d{1,6})?)?\s*([a-z]+)\s*")


def parse_rate(value: object, what: str = "rate") -> tuple[int, float] | None:
    """A rate (``"100/s"``, ``"10/min"``, ``"5/2h"``) as (starts, period in
    seconds); None for None.  ConfigError unless it is one."""
    if value is None:
        return None
    found = _RATE.fullmatch(value) if isinstance(value, str) else None
    count = int(found.group(1)) if found else 0
    multiple = float(found.group(2) or 1) if found else 0.0
    if found is None or found.group(3) not in RATE_UNITS or not 1 <= count <= LIMIT_MAX or multiple <= 0:
        raise ConfigError(f"invalid {what}: must be starts per period such as '100/s', '10/min' or '5/2h', "
                          f"got {value!r}")
    return count, multiple * RATE_UNITS[found.group(3)]
