"""How the command line reports what went wrong: never a DSN's password (in
argparse's messages about arguments it could not place), and nothing when
the reader of its output went away."""

from __future__ import annotations

import select
import sys
from collections.abc import Sequence

from pgfence.store import db


def dsn_arguments(argv: Sequence[str]) -> list[str]:
    """The command-line arguments (or the values of ``--opt=value`` ones)
    that hold a DSN with a password, however mistyped their flag."""
    found = []
    for arg in argv:
        for text in (arg, arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else ""):
            if text and db.has_password(text):
                found.append(text)
    return found


def scrub_argv(message: str, argv: Sequence[str]) -> str:
    """``message`` (argparse quotes arguments it cannot place: a mistyped
    ``--dns postgresql://u:pw@...``) without any DSN of the command line."""
    for dsn in dsn_arguments(argv):
        message = db.scrub(message, dsn)
    return message


def stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll
    reports an error on the write end of a pipe that has no reader left)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return False
    return any(mask & select.POLLERR for _fd, mask in events)
