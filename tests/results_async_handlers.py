"""The results test's async-only module (the a_* kinds of tests/results_kinds.py)."""

from results_kinds import ASYNC, register

register("a", ASYNC)
