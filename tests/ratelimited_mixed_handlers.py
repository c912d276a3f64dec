"""The rate-limited test's mixed module (tests/ratelimited_kinds.py)."""

from ratelimited_kinds import asynchronous, register, sync

register("r", sync)
register("a", asynchronous)
