"""How the arbiter forks: with one thread and the start-up signals blocked,
and what a child drops of what it inherits."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

from pgfence.prefork import child
from pgfence.prefork.sdnotify import SystemdReporter

log = logging.getLogger("pgfence.arbiter")


def fork() -> int:
    """``os.fork``, with the signals a child blocks until it is ready
    (child.STARTUP_BLOCKED) blocked in the child; 0 in the child."""
    # The arbiter runs no thread, so nothing another thread holds can be
    # copied locked into the child.
    assert threading.active_count() == 1, "the arbiter must fork with one thread"
    sys.stdout.flush()
    sys.stderr.flush()
    # See child.STARTUP_BLOCKED: the child unblocks them once it is ready.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, child.STARTUP_BLOCKED)
    pid = -1
    try:
        pid = os.fork()
        return pid
    finally:
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def fork_helper(name: str, main: Callable[[], int]) -> int:
    """Fork a helper process (heartbeat manager, metrics server) that runs
    ``main`` and leaves with ``os._exit``, never returning here."""
    pid = fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            code = main()
        except BaseException as exc:  # noqa: BLE001 - must reach os._exit
            log.error("%s crashed: %s: %s", name, type(exc).__name__, exc)
        finally:
            logging.shutdown()
            os._exit(code)
    return pid


def close_inherited(metrics_sock: socket.socket | None, systemd: SystemdReporter) -> None:
    """In a child: drop what only the arbiter (and the metrics server, which
    passes no socket here) needs."""
    if metrics_sock is not None:
        metrics_sock.close()
    systemd.close()
    # Only the arbiter speaks to systemd (NotifyAccess=main).
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        os.environ.pop(name, None)
