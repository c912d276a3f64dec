"""Error text as pgfence keeps and shows it: a handler's traceback capped to
a size a row can carry, and any text from a job made safe for a terminal.

An error message is written by a handler, from data a producer sent: it may
hold newlines, ANSI escapes or other control characters.  Everything pgfence
prints or logs of it goes through :func:`printable` or :func:`one_line`.
"""

from __future__ import annotations

import traceback

#: Characters of a traceback kept in ``last_traceback``.  A deep traceback
#: through psycopg is 3 to 6 kB; 16 kB keeps any ordinary one whole, while a
#: handler that raises a megabyte-long message cannot bloat the jobs table.
TRACEBACK_CAP = 16_384
#: Of a traceback cut to the cap, the characters kept from its start (the
#: outermost frames: where the handler was entered); the rest of the cap
#: goes to its end (the innermost frames and the exception line).
TRACEBACK_HEAD = 4_096

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def one_line(text: str) -> str:
    """``text`` on one line with every non-printable character (control
    characters, ANSI escapes, newlines, bidirectional overrides) and the
    backslash written as a Python-style escape, so that what it shows cannot
    be mistaken for, or rewrite, anything else on the terminal."""
    return "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in text)


def printable(text: str) -> str:
    """Like :func:`one_line`, but keeping the line breaks (as ``\\n``) so a
    traceback still reads as lines; each line is escaped on its own."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, escaped (:func:`one_line`)."""
    for line in text.splitlines():
        if line.strip():
            return one_line(line.strip())
    return ""


def cap(text: str, limit: int = TRACEBACK_CAP, head: int = TRACEBACK_HEAD) -> str:
    """``text`` itself if it fits in ``limit`` characters, else its first
    ``head`` characters and its end, joined by a line that says how much was
    cut; the result is exactly ``limit`` characters long."""
    if len(text) <= limit:
        return text
    marker = f"\n... [{len(text)} characters, cut to {limit}] ...\n"
    tail = limit - head - len(marker)
    return text[:head] + marker + text[len(text) - tail:]


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: a NUL byte (which no text column
    holds) written ``\\x00`` and a lone surrogate (which UTF-8 cannot
    encode: bytes decoded with ``surrogateescape``, say) as ``\\udcxx``.  An
    error message with either once made its report fail and killed the
    worker; everything else is kept as it is."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def format_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as Python prints it, capped (:func:`cap`)."""
    return cap("".join(traceback.format_exception(exc)).rstrip("\n"))
