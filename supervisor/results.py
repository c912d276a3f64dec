"""A job's result: what its handler returns, stored as JSON with the job
when it is done (``pgfence.job_history.result``, migration 0014) and read
back by :func:`pgfence.get_job`.

``None`` stores nothing; so does a kind declared ``@handler(...,
result=False)``.  Anything else must be JSON (``json.dumps`` with
``allow_nan=False``: dicts, lists, strings, numbers, booleans) of at most
:data:`MAX_BYTES` bytes, with no NUL in a string (jsonb cannot store it);
otherwise :class:`~pgfence.errors.ResultRejected`.
"""

from __future__ import annotations

import json

from pgfence.errors import ResultRejected

#: The largest result stored, in bytes of its JSON text (1 MiB): a result
#: is a summary (an id, a URL, counts), not a payload store; larger data
#: belongs in a table of the handler's, written in its fenced block.
MAX_BYTES = 1 << 20


def encode(value: object, *, store: bool = True) -> str | None:
    """The JSON text of ``value`` to store, or None when nothing is stored
    (``value`` is None, or ``store`` is False).  :class:`ResultRejected`
    when it cannot be stored."""
    if value is None or not store:
        return None
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ResultRejected(f"the handler's result is not JSON-serialisable: {exc}") from None
    # ensure_ascii (json.dumps's default): one byte per character.
    if len(text) > MAX_BYTES:
        raise ResultRejected(f"the handler's result is {len(text):,} bytes of JSON, over the limit of "
                             f"{MAX_BYTES:,} (pgfence.results.MAX_BYTES)")
    if "\\u0000" in text and has_nul(value):
        raise ResultRejected("the handler's result holds a NUL character (\\u0000) in a string, which jsonb "
                             "cannot store")
    return text


def has_nul(value: object) -> bool:
    """Whether a string of ``value`` (a key or a value, at any depth)
    holds NUL, which PostgreSQL's jsonb refuses."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False
