"""Payload readers shared by the example handlers (no handler here, so
importing it registers nothing)."""

from __future__ import annotations

from pgfence import AsyncJob, Job, PayloadRejected


def seconds_of(job: Job | AsyncJob, default: float = 0.0) -> float:
    """``payload.seconds``: a number of seconds >= 0 (PayloadRejected if not)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    value = payload.get("seconds", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PayloadRejected(f"'seconds' must be a number of seconds >= 0, got {value!r}")
    return float(value)
