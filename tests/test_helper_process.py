"""The supervision policy of the arbiter's helper processes (the renewal
process, the metrics server), as pure logic: no fork, no database.  The same
policy with real processes and signals is tested in test_supervisor.py."""

from __future__ import annotations

import os
import socket
import time

import pytest

from pgfence.prefork.helper import BOOT_BACKOFF_MAX, MAX_BOOT_FAILURES, HelperProcess, boot_backoff
from pgfence.prefork.sdnotify import Notifier, SystemdReporter


class FakeStart:
    """Stands for the fork: hands out pids of no process, so that a signal
    the helper sends (TERM on a reload) reaches nobody."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def __call__(self) -> int:
        # Pids far above any real one (pid_max is at most 2**22), so a
        # signal sent by mistake reaches nobody.
        self.pids.append(2**30 + len(self.pids))
        return self.pids[-1]


def make(up: bool) -> tuple[HelperProcess, FakeStart]:
    start = FakeStart()
    return HelperProcess("test helper", start, lambda _pid, _lived: up), start


def test_boot_backoff_doubles_from_a_fifth_of_a_second_and_is_capped():
    assert [boot_backoff(n) for n in range(1, 8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, BOOT_BACKOFF_MAX]
    assert boot_backoff(100) == BOOT_BACKOFF_MAX


def test_a_helper_that_dies_before_it_is_up_waits_longer_each_time_then_is_given_up():
    helper, start = make(up=False)
    assert helper.due(time.monotonic())
    for failures in range(1, MAX_BOOT_FAILURES):
        pid = helper.spawn()
        assert not helper.due(time.monotonic())
        before = time.monotonic()
        assert helper.exited(pid, "exited with status 1") is None
        assert helper.failures == failures
        assert before + boot_backoff(failures) <= helper.respawn_at <= time.monotonic() + boot_backoff(failures)
        assert not helper.due(before)
        assert helper.due(helper.respawn_at)
    pid = helper.spawn()
    assert helper.exited(pid, "killed by SIGKILL") == (
        f"the test helper keeps dying at start ({MAX_BOOT_FAILURES} in a row, last killed by SIGKILL); stopping")
    assert helper.gave_up
    assert not helper.due(time.monotonic() + 3600)
    assert len(start.pids) == MAX_BOOT_FAILURES


def test_a_helper_that_was_up_is_restarted_at_once_and_its_failures_forgotten():
    up = False
    start = FakeStart()
    helper = HelperProcess("test helper", start, lambda _pid, _lived: up)
    for _ in range(3):
        helper.exited(helper.spawn(), "exited with status 1")
    assert helper.failures == 3
    up = True
    assert helper.exited(helper.spawn(), "killed by SIGKILL") is None
    assert helper.failures == 0
    assert helper.due(time.monotonic())


def test_is_up_is_asked_about_the_pid_that_exited_and_how_long_it_lived():
    asked: list[tuple[int, float]] = []
    helper = HelperProcess("test helper", FakeStart(), lambda pid, lived: bool(asked.append((pid, lived))))
    pid = helper.spawn()
    began = time.monotonic()
    helper.exited(pid, "exited with status 1")
    assert [p for p, _ in asked] == [pid]
    assert 0 <= asked[0][1] <= time.monotonic() - began + 0.5


def test_an_exit_asked_for_by_a_reload_is_no_failure_and_a_retired_helper_never_starts_again():
    helper, _start = make(up=False)
    pid = helper.spawn()
    helper.reload()        # TERM to a pid that is nobody: ESRCH is ignored
    assert helper.signalled
    assert helper.exited(pid, "exited with status 0") is None
    assert helper.failures == 0 and helper.due(time.monotonic())
    pid = helper.spawn()
    helper.retire()
    assert helper.exited(pid, "exited with status 0") is None
    assert helper.failures == 0
    assert not helper.due(time.monotonic() + 3600)


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_the_watchdog_is_fed_every_half_of_watchdog_usec_and_only_after_ready(notify_socket, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    reporter = SystemdReporter()
    assert reporter.notifier.watchdog_period == 15.0
    reporter.watchdog(100.0)
    assert received(notify_socket) == []          # not ready yet
    reporter.ready("1 workers up")
    reporter.ready("1 workers up")
    reporter.watchdog(100.0)
    reporter.watchdog(114.9)
    reporter.watchdog(115.0)
    assert received(notify_socket) == ["READY=1\nSTATUS=1 workers up", "WATCHDOG=1", "WATCHDOG=1"]
    reporter.stopping(22.5, "stopping (graceful), 1 workers")
    reporter.stopping(1.0, "again")
    assert received(notify_socket) == ["STOPPING=1\nEXTEND_TIMEOUT_USEC=22500000\nSTATUS=stopping (graceful), 1 workers"]
    reporter.close()


def test_no_watchdog_usec_no_watchdog_messages(notify_socket, monkeypatch):
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    reporter = SystemdReporter()
    reporter.ready("up")
    reporter.watchdog(1000.0)
    assert received(notify_socket) == ["READY=1\nSTATUS=up"]
    reporter.close()


def test_a_watchdog_meant_for_another_pid_is_not_ours(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Notifier(address="").watchdog_period is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier(address="").watchdog_period == 1.0
