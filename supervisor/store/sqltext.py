"""Statement text made safe to join with others into one simple-query
message (:meth:`pgfence.job.Job.fenced_writes`).

Joined naively, a statement that ends in a ``--`` comment comments out
everything after it (the fenced completion and the COMMIT), one that holds
two statements runs the second outside the fence's reach, and one that ends
inside a quote or a comment swallows the rest.  :func:`one_statement` scans
a statement as PostgreSQL's lexer does (quotes, ``E''`` strings, quoted
identifiers, dollar quotes, line and nested block comments), cuts trailing
comments, blanks and semicolons, and refuses, with :class:`UnsafeStatement`,
what cannot be made safe: an unterminated quote or comment, several
statements, an empty one, and transaction control (the block's transaction
is pgfence's).
"""

from __future__ import annotations

import re

from pgfence.errors import UnsafeStatement

# What changes the lexer's state outside quotes and comments.
_SPECIAL = re.compile(r"--|/\*|['\";$]")
_BLOCK = re.compile(r"/\*|\*/")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_WORDS = re.compile(r"[A-Za-z_]+")
_NOT_BLANK = re.compile(r"\S")
#: Statements that would end (or start) the block's transaction.
_TRANSACTION_CONTROL = {"begin", "start", "commit", "end", "abort", "rollback"}


def _ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$" or ord(ch) >= 0x80


def _last_blank_end(text: str, start: int, stop: int) -> int:
    """The end of the last non-blank character of ``text[start:stop]``, or
    -1 if that span is blank."""
    segment = text[start:stop].rstrip()
    return start + len(segment) if segment else -1


def one_statement(text: str, *, standard_strings: bool = True) -> str:
    """``text`` as exactly one statement, without trailing comments, blanks
    or semicolons; raise :class:`UnsafeStatement` if that cannot be done.

    ``standard_strings`` is the session's ``standard_conforming_strings``:
    off, a backslash escapes a quote in a plain ``'...'`` string too.
    """
    n = len(text)
    pos = 0
    end = -1          # end of the last significant character seen
    first = -1        # start of the first significant character
    after_semicolon = False

    def significant(start: int, stop: int) -> None:
        nonlocal end, first
        if after_semicolon:
            raise UnsafeStatement("several statements in one string: give each its own writes.execute()")
        if first < 0:
            first = start
        end = stop

    while pos < n:
        m = _SPECIAL.search(text, pos)
        stop = m.start() if m else n
        last = _last_blank_end(text, pos, stop)
        if last >= 0:
            significant(pos + (len(text[pos:stop]) - len(text[pos:stop].lstrip())), last)
        if m is None:
            break
        token, at = m.group(), m.start()
        if token == "--":
            newline = min((i for i in (text.find("\n", at), text.find("\r", at)) if i >= 0), default=n)
            pos = newline
        elif token == "/*":
            depth, scan = 1, at + 2
            while depth:
                inner = _BLOCK.search(text, scan)
                if inner is None:
                    raise UnsafeStatement("unterminated /* comment")
                depth += 1 if inner.group() == "/*" else -1
                scan = inner.end()
            pos = scan
        elif token == ";":
            after_semicolon = True
            pos = at + 1
        elif token == "'":
            backslash = not standard_strings or (
                at > 0 and text[at - 1] in "Ee" and (at < 2 or not _ident_char(text[at - 2])))
            pos = _close_quote(text, at, "'", backslash)
            significant(at, pos)
        elif token == '"':
            pos = _close_quote(text, at, '"', False)
            significant(at, pos)
        else:   # "$": a dollar quote, a parameter ($1) or part of an identifier
            tag = _DOLLAR_TAG.match(text, at)
            if tag is None or (at > 0 and _ident_char(text[at - 1])):
                significant(at, at + 1)
                pos = at + 1
            else:
                close = text.find(tag.group(), tag.end())
                if close < 0:
                    raise UnsafeStatement(f"unterminated dollar quote {tag.group()}")
                pos = close + len(tag.group())
                significant(at, pos)
    if end < 0:
        raise UnsafeStatement("empty statement (only blanks, comments or semicolons)")
    words = _WORDS.findall(text[first:first + 40].lower())[:2] if text[first].isalpha() else []
    if words and ((words[0] in _TRANSACTION_CONTROL and words[:2] != ["rollback", "to"])
                  or words[:2] == ["prepare", "transaction"]):
        raise UnsafeStatement(f"transaction control ({words[0].upper()}) in a fenced block: "
                              "pgfence begins and commits it")
    return text[first:end]


def _close_quote(text: str, at: int, quote: str, backslash: bool) -> int:
    """The index just past the quote that closes the one opened at ``at``."""
    scan = at + 1
    while True:
        close = text.find(quote, scan)
        if close < 0:
            kind = "string" if quote == "'" else "quoted identifier"
            raise UnsafeStatement(f"unterminated {kind} (missing {quote})")
        if backslash:
            # An odd number of backslashes right before it escapes it.
            run = close
            while run > at + 1 and text[run - 1] == "\\":
                run -= 1
            if (close - run) % 2:
                scan = close + 1
                continue
        if close + 1 < len(text) and text[close + 1] == quote:
            scan = close + 2   # a doubled quote
            continue
        return close + 1
