"""The fault matrix's mixed module: def and async def handlers in one module
(every kind of tests/matrix_kinds.py), so a worker runs both its threads and
its event loop."""

from matrix_kinds import TIMEOUT, async_block, async_effect, async_hang, sync_effect, sync_hang

from pgfence import handler

handler("m_def")(sync_effect)
handler("m_def_hang", timeout=TIMEOUT)(sync_hang)
handler("m_async")(async_effect)
handler("m_async_hang", timeout=TIMEOUT)(async_hang)
handler("m_async_block", timeout=TIMEOUT)(async_block)
