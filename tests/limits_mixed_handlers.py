"""The limits tests' mixed module: def and async def kinds in one module, so
a worker runs both its threads and its event loop, each kind under its own
limit of 3 at once.  See tests/limits_kinds.py."""

from limits_kinds import async_run, sync_run

from pgfence import handler

handler("l_def", concurrency=3)(sync_run)
handler("l_async", concurrency=3)(async_run)
