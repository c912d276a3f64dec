"""The rate-limited test's def-only module (tests/ratelimited_kinds.py)."""

from ratelimited_kinds import register, sync

register("r", sync)
