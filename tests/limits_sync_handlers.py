"""The limits tests' def-only module: a worker that loads it alone runs no
event loop.  See tests/limits_kinds.py and tests/test_limits_faults.py."""

from limits_kinds import sync_run

from pgfence import handler

#: At most 3 at once across every supervisor.
handler("l_def", concurrency=3)(sync_run)
#: At most 3 at once, and 1 of each concurrency key.
handler("l_keyed", concurrency=3, per_key_concurrency=1)(sync_run)
#: 1 of each concurrency key, no limit on the kind.
handler("l_key", per_key_concurrency=1)(sync_run)
#: One at a time.
handler("l_one", concurrency=1)(sync_run)
