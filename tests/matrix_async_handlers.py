"""The fault matrix's async-only module (``m_async``, ``m_async_hang``,
``m_async_block``): a worker that loads it alone runs its jobs on its event
loop only.  See tests/matrix_kinds.py."""

from matrix_kinds import TIMEOUT, async_block, async_effect, async_hang

from pgfence import handler

handler("m_async")(async_effect)
handler("m_async_hang", timeout=TIMEOUT)(async_hang)
handler("m_async_block", timeout=TIMEOUT)(async_block)
