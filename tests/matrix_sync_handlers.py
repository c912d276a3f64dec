"""The fault matrix's def-only module (``m_def``, ``m_def_hang``): a worker
that loads it alone runs no event loop.  See tests/matrix_kinds.py."""

from matrix_kinds import TIMEOUT, sync_effect, sync_hang

from pgfence import handler

handler("m_def")(sync_effect)
handler("m_def_hang", timeout=TIMEOUT)(sync_hang)
