"""Pure logic of the workers that run many jobs at once, without a database:
titles, settings, the claim plan, the event loop's pulse."""

from __future__ import annotations

import time

import pytest

from pgfence import AsyncJob, ConfigError, Job, handler, registry
from pgfence.prefork import proctitle
from pgfence.settings import ASYNC_CONCURRENCY_MAX, THREADS_MAX, Settings
from pgfence.worker.aio import BLOCKED_AFTER, EventLoop
from pgfence.worker.engine import Claim, ConcurrentWorker, make_worker
from pgfence.worker.slots import InlineSlot, LoopSlots, ThreadSlots
from pgfence.worker.engine import Worker
from pgtools import wait_for

DSN = "host=127.0.0.1 dbname=never_connected"


def test_a_serial_worker_title_is_unchanged():
    assert proctitle.worker(3, None) == "pgfence worker 3 idle"
    assert proctitle.worker(3, ("send_receipt", 42, 2)) == "pgfence worker 3 send_receipt job 42 attempt 2"


def test_a_concurrent_worker_title_shows_jobs_in_flight_and_capacity():
    assert proctitle.worker(3, None, busy=0, capacity=32) == "pgfence worker 3 [0/32 jobs] idle"
    assert (proctitle.worker(3, ("send_receipt", 42, 1), busy=5, capacity=32)
            == "pgfence worker 3 [5/32 jobs] send_receipt job 42 attempt 1")
    # Jobs in flight but none named (the last one started ended): no "idle".
    assert proctitle.worker(3, None, busy=2, capacity=32) == "pgfence worker 3 [2/32 jobs]"


def test_a_title_shows_a_hostile_kind_printable_and_cut():
    title = proctitle.worker(1, ("a\nb\x1b[31m" + "x" * 100, 7, 1), busy=1, capacity=4)
    assert title == "pgfence worker 1 [1/4 jobs] a?b?[31m" + "x" * 52 + " job 7 attempt 1"
    assert "\n" not in title and "\x1b" not in title


@pytest.mark.parametrize("name, value, message", [
    ("threads", 0, "invalid threads: must be a whole number of at least 1, got 0"),
    ("async_concurrency", 0, "invalid async_concurrency: must be a whole number of at least 1, got 0"),
    ("threads", THREADS_MAX + 1, f"invalid threads: at most {THREADS_MAX} per worker, got {THREADS_MAX + 1}"),
    ("async_concurrency", ASYNC_CONCURRENCY_MAX + 1,
     f"invalid async-concurrency: at most {ASYNC_CONCURRENCY_MAX} per worker, got {ASYNC_CONCURRENCY_MAX + 1}"),
    ("batch", 0, "invalid batch: must be a whole number of at least 1, got 0"),
])
def test_invalid_concurrency_settings_are_one_line(name, value, message):
    with pytest.raises(ConfigError) as info:
        Settings(**{name: value})
    assert str(info.value) == message


def test_capacity_and_claim_size_follow_threads_async_and_batch():
    s = Settings(threads=8, async_concurrency=50)
    assert (s.capacity(False), s.capacity(True)) == (8, 58)
    assert (s.claim_size(False), s.claim_size(True)) == (8, 58)
    assert Settings().claim_size(False) == 1          # one job at a time: claims of one, as before
    assert Settings(batch=100).claim_size(False) == 100
    assert Settings(threads=8, batch=4).claim_size(True) == 4


def test_make_worker_picks_the_one_slot_unless_threads_or_async_handlers():
    one = make_worker(DSN, Settings(renew=False))
    assert (type(one.sync_slots), one.loop_slots, one.capacity) == (InlineSlot, None, 1)
    many = make_worker(DSN, Settings(threads=2, renew=False))
    assert (type(many.sync_slots), many.loop_slots, many.capacity) == (ThreadSlots, None, 2)

    @handler("t_units_async")
    async def work(job: AsyncJob) -> None:
        pass

    assert registry.has_async()
    worker = make_worker(DSN, Settings(renew=False, async_concurrency=7))
    assert (type(worker.sync_slots), type(worker.loop_slots)) == (ThreadSlots, LoopSlots)
    assert (worker.threads, worker.async_slots, worker.capacity) == (1, 7, 8)


def test_the_claim_plan_takes_the_free_slots_of_the_roomier_side_first_then_the_other():
    @handler("t_units_sync")
    def sync_kind(job: Job) -> None:
        pass

    @handler("t_units_aio")
    async def async_kind(job: AsyncJob) -> None:
        pass

    aio = ["t_units_aio"]
    worker = ConcurrentWorker(DSN, Settings(renew=False, threads=4, async_concurrency=10))
    # The loop has more room: its kinds first, then every other kind for the threads.
    assert worker.claim_plan() == [Claim(10, kinds=aio, on_loop=True), Claim(4, not_kinds=aio)]
    # def handlers too: threads and a loop, and the claims go to both sides.
    assert (type(worker.sync_slots), type(worker.loop_slots)) == (ThreadSlots, LoopSlots)
    worker._running = [4, 3]                                     # threads full
    assert worker.claim_plan() == [Claim(7, kinds=aio, on_loop=True)]
    worker._running = [1, 10]                                    # loop full
    assert worker.claim_plan() == [Claim(3, not_kinds=aio)]
    worker._running = [0, 8]                                     # the threads have more room now
    assert worker.claim_plan() == [Claim(4, not_kinds=aio), Claim(2, kinds=aio, on_loop=True)]
    worker._running = [1, 3]
    worker._held = [4, 0]                # ended, not yet completed: their slots are free again...
    assert worker.claim_plan() == [Claim(7, kinds=aio, on_loop=True), Claim(3, not_kinds=aio)]
    worker._held = [6, 0]                # ...until completions fall behind by more than the capacity
    assert worker.claim_plan() == [Claim(7, kinds=aio, on_loop=True), Claim(1, not_kinds=aio)]
    worker._running, worker._held = [4, 10], [0, 0]
    assert worker.claim_plan() == []

    capped = ConcurrentWorker(DSN, Settings(renew=False, threads=4, async_concurrency=10, batch=2))
    capped._running = [4, 0]
    assert capped.claim_plan() == [Claim(2, kinds=aio, on_loop=True)]


def test_a_worker_of_one_side_claims_any_kind_into_its_free_slots():
    threads = ConcurrentWorker(DSN, Settings(renew=False, threads=4))
    assert threads.claim_plan() == [Claim(4)]
    assert (type(threads.sync_slots), threads.loop_slots) == (ThreadSlots, None)
    threads._running = [4, 0]
    assert threads.claim_plan() == []

    @handler("t_units_only_aio")
    async def async_kind(job: AsyncJob) -> None:
        pass

    for spec in list(registry.specs()):
        if not spec.is_async:
            del registry._REGISTRY[spec.kind]
    loop = ConcurrentWorker(DSN, Settings(renew=False, async_concurrency=50))
    assert loop.claim_plan() == [Claim(50)]
    # Async handlers alone: the loop's claims take any kind (a thread puts back the unknown ones).
    assert type(loop.loop_slots) is LoopSlots


def test_a_nearly_full_loop_claims_once_a_thirty_second_of_its_slots_is_free():
    @handler("t_units_share_aio")
    async def async_kind(job: AsyncJob) -> None:
        pass

    for spec in list(registry.specs()):
        if not spec.is_async:
            del registry._REGISTRY[spec.kind]
    loop = ConcurrentWorker(DSN, Settings(renew=False, async_concurrency=200))
    assert loop.loop_claim_min == 6
    loop._running = [0, 195]                 # 5 free: wait for one more job to end
    assert loop.claim_plan() == []
    loop._running = [0, 194]
    assert loop.claim_plan() == [Claim(6)]
    small = ConcurrentWorker(DSN, Settings(renew=False, async_concurrency=20))
    small._running = [0, 19]                 # under 32 slots: every free slot is claimed at once
    assert (small.loop_claim_min, small.claim_plan()) == (1, [Claim(1)])
    # Nothing running: any free slot is claimed (never stalled by the share).
    tiny = ConcurrentWorker(DSN, Settings(renew=False, async_concurrency=200, batch=3))
    assert tiny.claim_plan() == [Claim(3)]
    tiny._running = [0, 197]                 # never more asked for than one claim takes
    assert (tiny.loop_claim_min, tiny.claim_plan()) == (3, [Claim(3)])


def test_the_event_loop_reports_the_time_it_has_not_turned():
    loop = EventLoop()
    loop.start()
    try:
        wait_for(lambda: loop.silent_for() == 0.0, timeout=5)
        loop.call(time.sleep, BLOCKED_AFTER + 0.5)       # blocking code on the loop
        wait_for(lambda: loop.silent_for() > BLOCKED_AFTER, timeout=10)
        wait_for(lambda: loop.silent_for() == 0.0, timeout=10)   # it turns again afterwards
    finally:
        loop.stop()
    assert loop.loop.is_closed()


def test_a_wake_set_from_another_thread_ends_a_wait_along_a_silent_socket():
    """The claiming thread's idle wait on its connection ends when a job
    ends elsewhere (the wake set), and when the socket has data."""
    import socket
    import threading
    import time

    from pgfence.worker.wake import Wake

    quiet, other = socket.socketpair()
    wake = Wake()
    try:
        timer = threading.Timer(0.05, wake.set)
        timer.start()
        started = time.monotonic()
        assert wake.wait_along(quiet.fileno(), 30.0) is True
        assert time.monotonic() - started < 30.0      # ended by the wake, not the timeout
        timer.join()
        wake.clear()
        other.send(b"x")
        assert wake.wait_along(quiet.fileno(), 30.0) is False
        assert time.monotonic() - started < 30.0      # ended by the socket
        wake.close()
        wake.set()                                    # after close: nothing to write to, no error
        assert wake.is_set()
    finally:
        quiet.close()
        other.close()
