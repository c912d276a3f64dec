"""A wake-up that a worker's claiming thread can wait for together with its
connection's socket.

The claiming thread of an idle worker waits on its connection for an
enqueue's NOTIFY; a job that ends on another thread (or on the event loop)
must be able to cut that wait short too, when the side whose slot it freed
has jobs queued.  :class:`Wake` is a :class:`threading.Event` that, while
the claiming thread is inside :meth:`Wake.wait_along`, also writes a byte to
a pipe that the same ``select()`` watches.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading


class Wake:
    """Set from any thread; waited for by one thread at a time."""

    def __init__(self) -> None:
        self._event = threading.Event()
        #: The pipe, made on first use in the process that waits (never
        #: across a fork).
        self._pipe: tuple[int, int] | None = None
        self._selecting = False
        #: Held to write to the pipe and to close it, so that a late writer
        #: never writes to a descriptor number reused since.
        self._pipe_lock = threading.Lock()

    def set(self) -> None:
        self._event.set()
        # Written only while someone selects: the waiter flags itself
        # before it looks at the event, so either it sees the event set or
        # this sees the flag.
        if self._selecting:
            with self._pipe_lock, contextlib.suppress(OSError):   # full: a wake-up is pending anyway
                if self._pipe is not None:
                    os.write(self._pipe[1], b"\0")

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def wait_along(self, fd: int, timeout: float) -> bool:
        """Wait until set, ``fd`` is readable, or ``timeout`` seconds have
        passed; True when set."""
        if self._pipe is None:
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._pipe = (read, write)
        self._selecting = True
        try:
            if not self._event.is_set():
                select.select([fd, self._pipe[0]], [], [], max(0.0, timeout))
        finally:
            self._selecting = False
            with contextlib.suppress(BlockingIOError):
                while os.read(self._pipe[0], 512):
                    pass
        return self._event.is_set()

    def close(self) -> None:
        with self._pipe_lock:
            if self._pipe is not None:
                for fd in self._pipe:
                    os.close(fd)
                self._pipe = None
