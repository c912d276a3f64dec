"""The results test's def-only module (the r_* kinds of tests/results_kinds.py)."""

from results_kinds import SYNC, register

register("r", SYNC)
