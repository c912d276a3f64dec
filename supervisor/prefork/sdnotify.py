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
        self.watchdog_interval = (int(usec) / 1e6 / 2) if usec and usec.isdigit() and \
            (not pid or pid == str(os.getpid())) else None

    @property
    def enabled(self) -> bool:
        return self.sock is not None

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
