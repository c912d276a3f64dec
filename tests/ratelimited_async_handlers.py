"""The rate-limited test's async-only module (tests/ratelimited_kinds.py)."""

from ratelimited_kinds import asynchronous, register

register("a", asynchronous)
