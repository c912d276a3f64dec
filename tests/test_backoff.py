"""The retry backoff policy, without a database (pgfence.backoff)."""

from __future__ import annotations

from pgfence.backoff import Backoff
from pgfence.settings import Settings
from pgfence.worker.engine import Worker


def test_backoff_is_exponential_capped_and_jittered() -> None:
    backoff = Backoff(base=2.0, cap=20.0)
    for attempt, full in [(0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 20.0), (12, 20.0)]:
        assert backoff.ceiling(attempt) == full
        samples = [backoff.delay(attempt) for _ in range(400)]
        assert all(full * 0.5 <= s <= full for s in samples), (attempt, min(samples), max(samples))
        # Jitter spreads over the whole range, not a fixed value.
        assert min(samples) < full * 0.6 and max(samples) > full * 0.9, (attempt, min(samples), max(samples))


def test_backoff_jitter_bounds_are_exact() -> None:
    backoff = Backoff(base=0.5, cap=300.0)
    assert backoff.delay(3, uniform=lambda low, high: low) == 1.0
    assert backoff.delay(3, uniform=lambda low, high: high) == 2.0


def test_backoff_of_a_job_with_thousands_of_attempts_is_the_cap() -> None:
    # 2 ** 5000 seconds does not fit a float: the cap applies, no overflow.
    assert Backoff(base=1.0, cap=300.0).ceiling(5000) == 300.0
    assert Backoff(base=86400.0, cap=30 * 86400.0).ceiling(10**9) == 30 * 86400.0


def test_the_worker_and_its_heartbeat_share_the_settings_backoff() -> None:
    worker = Worker("postgresql://unused@127.0.0.1:1/x", Settings(backoff_base=2.0, backoff_max=20.0), name="b")
    try:
        assert worker.retry_backoff == Backoff(2.0, 20.0)
        assert worker.heartbeat is not None and worker.heartbeat.backoff == Backoff(2.0, 20.0)
    finally:
        worker.close()
