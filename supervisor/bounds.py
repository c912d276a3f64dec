"""The range each duration may take, in seconds.

A duration far outside these ranges is a typo, never a plan: a lease of
``1e13`` seconds overflows PostgreSQL's timestamps (the children crashed at
every claim, respawned, and crashed again), a heartbeat beyond 24.8 days
overflows ``statement_timeout``, and a lease of a millisecond is over before
the claim's reply arrives.  Each setting (and a handler's own ``lease`` and
``timeout``) is checked against its range when it is read, so such a value
is one line at start instead of a crash loop.  The docs' settings table
lists the same ranges.
"""

from __future__ import annotations

import math
from typing import Any

from pgfence.errors import ConfigError

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

#: (lowest, highest) seconds of each duration, by setting name.
RANGES: dict[str, tuple[float, float]] = {
    "lease": (0.1, 7 * DAY),
    "heartbeat": (0.05, DAY),
    "poll_interval": (0.01, HOUR),
    "timeout": (0.1, 7 * DAY),
    "backoff_base": (0.01, DAY),
    "backoff_max": (0.01, 30 * DAY),
    "unknown_kind_delay": (0.01, 7 * DAY),
    "unknown_kind_timeout": (0.1, 365 * DAY),
    "retention": (1.0, 3650 * DAY),
    "prune_interval": (0.01, DAY),
    "graceful_timeout": (0.01, DAY),
    "lost_lease_kill_after": (0.01, HOUR),
    "vacuum_warn_horizon": (1.0, 30 * DAY),
    "periodic_grace": (1.0, DAY),
}


def human(seconds: float) -> str:
    """``seconds`` in the largest unit that writes it whole: ``7d``, ``1h``,
    ``0.1s``."""
    for unit, size in (("d", DAY), ("h", HOUR), ("m", MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def describe(name: str) -> str:
    low, high = RANGES[name]
    return f"{human(low)} to {human(high)}"


def check(name: str, value: Any, *, label: str | None = None) -> None:
    """Raise :class:`ConfigError` (one line naming ``label``, by default the
    setting's name with dashes) unless ``value`` is a number of seconds in
    the range of setting ``name``."""
    low, high = RANGES[name]
    label = label or name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ConfigError(f"invalid {label}: must be a number of seconds from {human(low)} to {human(high)}, "
                          f"got {value!r}")
