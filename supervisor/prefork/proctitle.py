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


def worker(number: int, job: tuple[str, int, int] | None, *, busy: int | None = None,
           capacity: int = 1) -> str:
    """A worker child's title: ``pgfence worker 3 send_receipt job 42
    attempt 1`` (or ``idle``) for one that runs one job at a time; for one
    that runs many, with its jobs in flight and its capacity first:
    ``pgfence worker 3 [5/32 jobs] send_receipt job 42 attempt 1``, naming
    the job started last.  ``job`` is (kind, id, attempt): never a payload.
    The kind is shown printable and cut at 60 characters."""
    head = f"pgfence worker {number}"
    if capacity > 1:
        head += f" [{busy or 0}/{capacity} jobs]"
    if job is None:
        return f"{head} idle" if not busy else head
    kind, job_id, attempt = job
    shown = "".join(c if c.isprintable() else "?" for c in kind)[:60]
    return f"{head} {shown} job {job_id} attempt {attempt}"


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
