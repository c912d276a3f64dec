"""The arbiter's signals: its handlers only record a signal's name; the main
loop, woken by the wakeup pipe, dispatches each to a ``handle_<name>``
method of the arbiter."""

from __future__ import annotations

import os
import select
import signal

SIGNALS = ("HUP", "INT", "QUIT", "TERM", "TTIN", "TTOU", "CHLD")


class SignalInbox:
    """The signals received and not yet handled, and the sleep they cut
    short."""

    def __init__(self) -> None:
        #: Names (``TERM``), in the order they came.
        self.pending: list[str] = []

    def install(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        for name in SIGNALS:
            signal.signal(getattr(signal, f"SIG{name}"), self._record)

    def _record(self, signum: int, _frame: object) -> None:
        # Record only: the loop acts.
        self.pending.append(signal.Signals(signum).name[3:])

    def sleep(self, seconds: float) -> None:
        """Wait up to ``seconds``, or until a signal comes."""
        try:
            ready, _, _ = select.select([self._wake_r], [], [], seconds)
        except InterruptedError:
            return
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
