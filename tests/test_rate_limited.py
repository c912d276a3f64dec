"""A handler's RateLimited (the service it calls answered 429), in every
mode: the job goes back for its retry_after without spending an attempt,
the attempt is recorded as released with why, and a kind with a rate starts
none of its jobs before then."""

from __future__ import annotations

import pytest
from pgtools import scalar, wait_for
from supervisors import supervisor_fixture

import pgfence
from pgfence import RateLimited
from pgfence.errors import ConfigError

supervisors = supervisor_fixture(defaults={"lease": 10, "poll_interval": 0.2})

MODES = {
    "loop": ({"handlers": "ratelimited_sync_handlers", "workers": 1, "threads": 1}, ["r"]),
    "threads": ({"handlers": "ratelimited_sync_handlers", "workers": 1, "threads": 4}, ["r"]),
    "async": ({"handlers": "ratelimited_async_handlers", "workers": 1, "async_concurrency": 8}, ["a"]),
    "mixed": ({"handlers": "ratelimited_mixed_handlers", "workers": 1, "threads": 4, "async_concurrency": 8},
              ["r", "a"]),
}


def test_retry_after_is_checked():
    assert RateLimited(30).retry_after == 30.0
    assert str(RateLimited(1.5, "429 from the API")) == "429 from the API: retry after 1.5s"
    for bad in (-1, 86401, "30", True, float("nan")):
        with pytest.raises(ConfigError, match=r"^invalid retry_after: must be 0 to 86400 seconds"):
            RateLimited(bad)


@pytest.mark.parametrize("mode", MODES)
def test_a_rate_limited_job_comes_back_after_its_retry_after_without_spending_an_attempt(conn, supervisors,
                                                                                          mode):
    conn.execute("CREATE SCHEMA rl")
    conn.execute("CREATE TABLE rl.effects (job_id bigint, attempt int, PRIMARY KEY (job_id, attempt))")
    options, prefixes = MODES[mode]
    sup = supervisors(**options)
    sup.wait_workers(1, timeout=30)
    jobs = {}
    for prefix in prefixes:
        for sort in ("limited", "rated"):
            jobs[f"{prefix}_{sort}"] = pgfence.enqueue(conn, f"{prefix}_{sort}", {"refuse": True})
    # The 429 closed the rated kinds: a job enqueued after it waits too.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.job_attempts") == len(jobs), timeout=20,
             message="the first attempts refused")
    later = {f"{p}_rated": pgfence.enqueue(conn, f"{p}_rated") for p in prefixes}
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.job_history") == len(jobs) + len(later),
             timeout=30, message="every job done")
    assert sup.stop() == 0
    for kind, job_id in jobs.items():
        info = pgfence.get_job(conn, job_id)
        assert (info.status, info.attempt) == ("done", 2), kind
        assert [(a.attempt, a.outcome, a.detail) for a in info.attempts] == \
            [(1, "released", "the mail service answered 429: retry after 0.5s")], kind
        refused_at = info.attempts[0].started_at
        waited = (info.started_at - refused_at).total_seconds()
        assert waited >= 0.5, (kind, waited)
        assert conn.execute("SELECT putbacks FROM pgfence.job_history WHERE id = %s", (job_id,)).fetchone() == (1,)
    assert sorted(conn.execute("SELECT job_id, attempt FROM rl.effects").fetchall()) == \
        sorted([(i, 2) for i in jobs.values()] + [(i, 1) for i in later.values()])
    for kind, job_id in later.items():
        started = scalar(conn, "SELECT started_at FROM pgfence.job_history WHERE id = %s", (job_id,))
        refused = pgfence.get_job(conn, jobs[kind]).attempts[0].started_at
        assert (started - refused).total_seconds() >= 0.5, kind
