"""Process identity after the fork: titles (``ps``, ``top``) that say what
each process is doing, never a password or a payload; and the tie to the
arbiter, so that no child outlives it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

import setproctitle as _spt


def set(title: str) -> None:  # noqa: A001 - mirrors setproctitle's verb
    _spt.setproctitle(title)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to send SIGTERM when the arbiter dies (even by
    SIGKILL), so a child never goes on claiming jobs without supervision.
    Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    # The arbiter may have died between the fork and the prctl.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)
