"""The results test's mixed module: the r_* and a_* kinds of tests/results_kinds.py."""

from results_kinds import ASYNC, SYNC, register

register("r", SYNC)
register("a", ASYNC)
