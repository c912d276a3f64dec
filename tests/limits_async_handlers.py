"""The limits tests' async-only module: a worker that loads it alone runs
its jobs on its event loop only.  See tests/limits_kinds.py."""

from limits_kinds import async_run

from pgfence import handler

#: At most 3 at once across every supervisor.
handler("l_async", concurrency=3)(async_run)
