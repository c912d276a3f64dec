"""The background services' one base (pgfence.background.Service): its
loop, waits, start and stop, without a database (no step here connects)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from pgtools import wait_for
from pgfence.background import Service

log = logging.getLogger("pgfence.test.background")

SECRET_DSN = "postgresql://u:s3cret-pw@127.0.0.1:1/test"


class Steps(Service[int]):
    """Counts its steps; raises where ``plan`` says so."""

    thread_name = "pgfence-test-steps"
    failure = "test step failed"

    def __init__(self, *, interval: float = 3600.0, plan: list[BaseException | None] | None = None,
                 waits: list[float] | None = None) -> None:
        super().__init__(SECRET_DSN, interval=interval, log=log)
        self.plan = list(plan or [])
        self.waits = list(waits or [])
        self.calls = 0
        self.threads: list[str] = []
        self.ran = threading.Event()

    def run_once(self) -> int:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.ran.set()
        error = self.plan.pop(0) if self.plan else None
        if error is not None:
            raise error
        return self.calls

    def wait_after(self, result: int) -> float:
        return self.waits.pop(0) if self.waits else self.interval


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval must be positive"):
        Steps(interval=0)


def test_start_and_stop_are_idempotent_and_a_stop_wakes_the_wait():
    service = Steps(interval=3600.0)
    service.stop()                       # before any start: nothing to end
    assert not service.running
    service.start()
    thread = service._thread
    service.start()                      # already running: the same thread
    assert service._thread is thread and service.running
    assert service.ran.wait(5.0)
    started = time.monotonic()
    service.stop()                       # wakes the hour's wait at once
    assert time.monotonic() - started < 1.0
    assert not service.running and service.calls == 1 and service.threads == ["pgfence-test-steps"]
    service.stop()
    assert not service.running and service.calls == 1


def test_a_wake_runs_the_next_step_at_once():
    service = Steps(interval=3600.0)
    service.start()
    try:
        wait_for(lambda: service.calls == 1, timeout=5, message="the first step")
        service.wake()                       # the hour's wait ends now
        wait_for(lambda: service.calls == 2, timeout=5, message="a step right after the wake")
    finally:
        service.stop()
    assert service.calls == 2


def test_a_stopped_service_starts_again():
    service = Steps(interval=3600.0)
    service.start()
    wait_for(lambda: service.calls == 1, timeout=5, message="the first step")
    service.stop()
    service.start()
    wait_for(lambda: service.calls == 2, timeout=5, message="a step after the restart")
    service.stop()
    assert (service.calls, service.steps, service.running) == (2, 2, False)


def test_a_step_that_raises_is_logged_with_the_password_masked_and_the_loop_goes_on(caplog):
    boom = RuntimeError(f"could not reach {SECRET_DSN}")
    service = Steps(interval=0.01, plan=[boom, ValueError("second"), None, None])
    caplog.set_level(logging.WARNING, logger=log.name)
    service.start()
    try:
        wait_for(lambda: service.steps >= 2, timeout=5, message="steps after two failures")
    finally:
        service.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert warnings == ["test step failed: could not reach ***", "test step failed: second"]
    assert service.failures == 0 and service.calls >= 4


def test_the_step_reschedules_itself_before_it_runs():
    # A step that returns waits wait_after(result) from its end; one that
    # raises keeps the time set before it ran: retry_wait from its start.
    service = Steps(interval=2.0, plan=[RuntimeError("down"), None], waits=[0.25])
    before = time.monotonic()
    wait = service.step()
    assert 2.0 - (time.monotonic() - before) <= wait <= 2.0
    assert (service.failures, service.steps) == (1, 0)
    assert service.step() == 0.25
    assert (service.failures, service.steps) == (0, 1)
    assert service.step() == 2.0


def test_retry_wait_counts_the_failures_in_a_row():
    class Backing(Steps):
        def retry_wait(self, failures: int) -> float:
            return 10.0 * failures

    service = Backing(plan=[RuntimeError("a"), RuntimeError("b"), None, RuntimeError("c")])
    waits = [round(service.step()) for _ in range(4)]
    assert waits == [10, 20, 3600, 10]


def test_the_threads_steps_follow_wait_after():
    service = Steps(interval=3600.0, waits=[0.0, 0.0, 0.0])
    service.start()
    try:
        wait_for(lambda: service.calls == 4, timeout=5, message="three steps without a wait, then one")
    finally:
        service.stop()
    assert service.calls == 4


def test_a_service_with_one_thing_to_do_retries_until_it_is_done_then_ends():
    class Once(Steps):
        def finished(self, result: int) -> bool:
            return True

    service = Once(interval=0.01, plan=[RuntimeError("down"), RuntimeError("still down"), None, None])
    service.start()
    try:
        wait_for(lambda: not service.running, timeout=5, message="the thread ended after its step")
    finally:
        service.stop()
    assert (service.calls, service.steps, service.failures) == (3, 1, 0)
    # A step run by hand once it is done ends it again: no wait.
    assert service.step() == 0.0 and service.calls == 4
