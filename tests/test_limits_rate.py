"""A rate limit across supervisors, on the database clock: real ``pgfence
run`` processes, the rate set at run time from the command line."""

from __future__ import annotations

import pytest
from pgtools import pgfence, scalar, wait_for
from supervisors import supervisors  # noqa: F401 - the fixture

import pgfence as api


def starts(conn) -> list[float]:
    """Seconds from the first start, of every finished job's start."""
    return [s for (s,) in conn.execute(
        "SELECT extract(epoch FROM started_at - min(started_at) OVER ())::float8 FROM pgfence.job_history "
        "ORDER BY started_at")]


def most_in_any(window: float, times: list[float]) -> int:
    """The most starts within any ``window`` seconds."""
    best, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] > window:
            first += 1
        best = max(best, last - first + 1)
    return best


def run_rated(conn, dsn, supervisors, rate: str, jobs: int, done: int, timeout: float):  # noqa: F811
    out = pgfence("limits", "set", "noop", "--rate", rate, dsn=dsn)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    api.enqueue_many(conn, [{"kind": "noop"}] * jobs)
    sups = [supervisors(workers=2, threads=4), supervisors(workers=1, threads=4)]
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.job_history") >= done, timeout=timeout,
             interval=0.1, message=f"{done} jobs done at {rate}")
    for sup in sups:
        assert sup.stop() == 0
    return starts(conn)


def test_a_rate_holds_across_supervisors(conn, dsn, supervisors):  # noqa: F811
    """10/s with two supervisors claiming.  In any W seconds at most W x 10
    starts, plus the rate's burst (a second's worth, 10: GCRA's tolerance),
    plus the jobs admitted before any worker ran (at most a burst), plus
    one; and no slower than 8/s once those are spent."""
    times = run_rated(conn, dsn, supervisors, "10/s", jobs=60, done=45, timeout=30)
    for window in (1.0, 3.0):
        assert most_in_any(window, times) <= window * 10 + 10 + 10 + 1, (window, times)
    assert most_in_any(3.0, times) >= 30
    span = times[44] - times[20]
    assert 24 / span >= 8.0, f"24 starts in {span:.2f}s"


@pytest.mark.slow
def test_a_rate_holds_within_5_percent_over_a_minute(conn, dsn, supervisors):  # noqa: F811
    """20/s for over a minute across two supervisors: the limit holds within
    5% over the minute from 5 s to 65 s (at most 1,260 starts).  What the
    workers use of it is not asserted: 1,200 on a quiet machine, 1,037 to
    1,119 in CI runs, where admission by time came late enough to lose part
    of a burst (known, not mended)."""
    times = run_rated(conn, dsn, supervisors, "20/s", jobs=1500, done=1400, timeout=120)
    in_minute = sum(1 for t in times if 5.0 <= t < 65.0)
    assert in_minute <= 1260, in_minute
