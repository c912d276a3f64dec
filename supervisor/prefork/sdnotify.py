"""systemd's notify protocol (``Type=notify``): a datagram to
``$NOTIFY_SOCKET``.  A few lines, no dependency, no thread."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``... when run under
    systemd; does nothing otherwise."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self.address: str | None = None
        self.sock: socket.socket | None = None
        if address:
            # An address starting with @ is in the abstract namespace.
            self.address = "\0" + address[1:] if address.startswith("@") else address
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        #: Seconds between two WATCHDOG=1: half of systemd's WatchdogSec, as
        #: sd_watchdog_enabled(3) advises; None when systemd set no watchdog
        #: for this process (then nobody reads WATCHDOG=1).
        self.watchdog_period: float | None = (int(usec) / 1e6 / 2) if usec and usec.isdigit() and \
            int(usec) > 0 and (not pid or pid == str(os.getpid())) else None

    def send(self, *lines: str) -> bool:
        if self.sock is None or self.address is None:
            return False
        try:
            self.sock.sendto("\n".join(lines).encode(), self.address)
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class SystemdReporter:
    """What the arbiter tells systemd: ``READY=1`` once, ``WATCHDOG=1`` every
    watchdog period while supervision is healthy, ``STOPPING=1`` once."""

    def __init__(self, notifier: Notifier | None = None) -> None:
        self.notifier = notifier if notifier is not None else Notifier()
        self.ready_sent = False
        self.stopping_sent = False
        self._last_watchdog = 0.0

    def ready(self, status: str) -> None:
        if not self.ready_sent:
            self.ready_sent = True
            self.notifier.send("READY=1", f"STATUS={status}")

    def stopping(self, extend_seconds: float, status: str) -> None:
        """The drain began; systemd waits ``extend_seconds`` more before its
        own KILL."""
        if not self.stopping_sent:
            self.stopping_sent = True
            self.notifier.send("STOPPING=1", f"EXTEND_TIMEOUT_USEC={int(extend_seconds * 1e6)}",
                               f"STATUS={status}")

    def watchdog(self, now: float) -> None:
        """Feed the watchdog, at most once a period and only after READY."""
        period = self.notifier.watchdog_period
        if period is None or not self.ready_sent or now - self._last_watchdog < period:
            return
        self._last_watchdog = now
        self.notifier.send("WATCHDOG=1")

    def close(self) -> None:
        """In a child: only the arbiter speaks to systemd (NotifyAccess=main)."""
        self.notifier.close()
