"""Concurrency limits at the database (migration 0017): admission, the
paths that free a slot, limits changed at run time, and bad input.  Each
test drives pgfence's own statements (the store's claim, completion,
retry, release, cancel) on a real database; the processes and faults are
tests/test_limits_faults.py's."""

from __future__ import annotations

import threading

import psycopg
import pytest
from pgtools import scalar, wait_for

import pgfence
from pgfence.admin import limits as admin
from pgfence.backoff import Backoff
from pgfence.errors import ConfigError
from pgfence.store import jobs as store
from pgfence.store import limits as limits_store


def limit(conn, kind: str, concurrency: int | None = None, per_key: int | None = None) -> None:
    admin.set_limits(conn, kind, concurrency=concurrency, per_key_concurrency=per_key, by="test")


def held(conn, kind: str | None = None) -> dict[int, str | None]:
    """id -> held_back of the live jobs (of ``kind``)."""
    return dict(conn.execute("SELECT id, held_back FROM pgfence.jobs WHERE kind = coalesce(%s, kind) ORDER BY id",
                             (kind,)).fetchall())


def holders(conn, kind: str, key: str | None = None) -> int:
    return scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE kind = %s AND gated AND held_back IS NULL "
                        "AND (%s::text IS NULL OR concurrency_key = %s)", (kind, key, key))


def claim(conn, batch: int = 10, worker: str = "w1", lease: float = 30.0, reclaim: bool = False):
    return store.claim(conn, queues=["default"], batch=batch, worker=worker, lease=lease, lease_kinds=[],
                       lease_secs=[], reclaim=reclaim)


def test_a_kind_limit_admits_that_many_and_the_claim_takes_no_other(conn):
    limit(conn, "export", concurrency=2)
    ids = [pgfence.enqueue(conn, "export", {"n": n}) for n in range(5)]
    free = pgfence.enqueue(conn, "mail")
    assert held(conn) == {ids[0]: None, ids[1]: None, ids[2]: "concurrency", ids[3]: "concurrency",
                          ids[4]: "concurrency", free: None}
    assert sorted(r.id for r in claim(conn)) == [ids[0], ids[1], free]
    assert claim(conn) == []
    # A completion frees its slot at its commit: the next held job is admitted.
    with conn.transaction():
        assert store.complete(conn, ids[0], 1)
    assert held(conn, "export") == {ids[1]: None, ids[2]: None, ids[3]: "concurrency", ids[4]: "concurrency"}
    assert [r.id for r in claim(conn)] == [ids[2]]
    info = pgfence.get_job(conn, ids[3])
    assert (info.status, info.held_back) == ("queued", "concurrency")


def test_admission_takes_held_jobs_in_priority_order(conn):
    limit(conn, "export", concurrency=1)
    first = pgfence.enqueue(conn, "export")
    low = pgfence.enqueue(conn, "export", priority=-1)
    high = pgfence.enqueue(conn, "export", priority=5)
    assert [r.id for r in claim(conn)] == [first]
    with conn.transaction():
        store.complete(conn, first, 1)
    assert held(conn, "export") == {low: "concurrency", high: None}


def test_a_per_key_limit_counts_each_key_apart(conn):
    limit(conn, "sync", per_key=1)
    a1 = pgfence.enqueue(conn, "sync", concurrency_key="customer:a")
    a2 = pgfence.enqueue(conn, "sync", concurrency_key="customer:a")
    b1 = pgfence.enqueue(conn, "sync", concurrency_key="customer:b")
    nokey = pgfence.enqueue(conn, "sync")   # no key: no per-key limit applies
    assert held(conn) == {a1: None, a2: "concurrency", b1: None, nokey: None}
    assert scalar(conn, "SELECT gated FROM pgfence.jobs WHERE id = %s", (nokey,)) is False
    assert sorted(r.id for r in claim(conn)) == [a1, b1, nokey]
    with conn.transaction():
        store.complete(conn, b1, 1)          # b's slot: nothing of a's moves
    assert held(conn, "sync")[a2] == "concurrency"
    with conn.transaction():
        store.complete(conn, a1, 1)
    assert held(conn, "sync")[a2] is None
    assert pgfence.get_job(conn, a2).concurrency_key == "customer:a"


def test_a_kind_limit_and_a_per_key_limit_together(conn):
    limit(conn, "sync", concurrency=2, per_key=1)
    ids = [pgfence.enqueue(conn, "sync", concurrency_key=key) for key in ("a", "a", "b", "c")]
    # Two slots of the kind: a's first and b's (a's second waits for a).
    assert held(conn) == {ids[0]: None, ids[1]: "concurrency", ids[2]: None, ids[3]: "concurrency"}
    claim(conn)
    with conn.transaction():
        store.complete(conn, ids[0], 1)
    # The kind's free slot goes to the next held job whose key has room: a's second.
    assert held(conn) == {ids[1]: None, ids[2]: None, ids[3]: "concurrency"}


def test_a_kind_and_per_key_limit_admit_round_robin_across_keys_past_a_long_backlog(conn):
    """A key with 600 jobs held neither blocks the others (the first 500
    held jobs were all of it) nor takes the kind's slots first: one job of
    every key with room, then the second of any."""
    limit(conn, "sync", concurrency=4, per_key=2)
    ids = pgfence.enqueue_many(conn, [{"kind": "sync", "concurrency_key": "a"}] * 600
                               + [{"kind": "sync", "concurrency_key": "b"}]
                               + [{"kind": "sync", "concurrency_key": "c"}] * 3)
    a, b, c = ids[:600], ids[600], ids[601:]
    admitted = sorted(i for i, h in held(conn).items() if h is None)
    assert admitted == sorted([a[0], b, c[0], a[1]])


def test_every_way_out_of_running_frees_the_slot(conn):
    """Failure, retry, release, put-back, cancel and a reclaim's verdict each
    free the slot in their own transaction; a reclaim hands it on."""
    limit(conn, "k", concurrency=1)
    jobs = [pgfence.enqueue(conn, "k", max_attempts=3, max_reclaims=1) for _ in range(7)]

    def running() -> int:
        (row,) = claim(conn, reclaim=True)
        return row.id

    def admitted() -> list[int]:
        return [i for i, h in held(conn, "k").items() if h is None]

    # A retry with a backoff waits for its run_at, not in a slot.
    job = running()
    with conn.transaction():
        store.fail_or_retry(conn, job, 1, error="boom", traceback=None, final=False, backoff=Backoff(60, 60))
    assert held(conn, "k")[job] == "scheduled"
    assert admitted() == [jobs[1]]
    # A final failure (to history).
    job = running()
    with conn.transaction():
        store.fail_or_retry(conn, job, 1, error="boom", traceback=None, final=True, backoff=Backoff(1, 1))
    assert admitted() == [jobs[2]]
    # A release (shutdown): back to the queue, and admitted again at once
    # (held jobs go in priority, run_at, id order: it is the oldest).
    job = running()
    with conn.transaction():
        store.release(conn, job, 1, reason="shutdown")
    assert admitted() == [job]
    assert running() == job
    # A put-back of an unknown kind.
    with conn.transaction():
        store.put_back_unknown(conn, job, 2, delay=60, give_up=3600, error="unknown kind")
    assert held(conn, "k")[job] == "scheduled"
    assert admitted() == [jobs[3]]
    # A cancel of the running holder.
    job = running()
    assert pgfence.cancel(conn, [job]) == [job]
    assert admitted() == [jobs[4]]
    # A reclaim keeps the slot for the next attempt of the same job ...
    job = running()
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job,))
    (again,) = claim(conn, reclaim=True)
    assert (again.id, again.attempt, admitted()) == (job, 2, [job])
    # ... and a reclaim's verdict (no reclaims left) fails it and frees it.
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job,))
    (verdict,) = claim(conn, reclaim=True)
    assert (verdict.id, verdict.status) == (job, "failed")
    assert admitted() == [jobs[5]]
    assert holders(conn, "k") == 1


def test_a_held_job_whose_run_at_comes_is_admitted_by_admit_due(conn):
    limit(conn, "k", concurrency=1)
    later = pgfence.enqueue(conn, "k", delay=0.3)
    assert held(conn) == {later: "scheduled"}
    assert claim(conn) == []
    wait_for(lambda: limits_store.admit_due(conn) == 1, timeout=10, message="the delayed job admitted when due")
    assert held(conn) == {later: None}
    assert [r.id for r in claim(conn)] == [later]


def test_raising_lowering_and_removing_a_limit_at_run_time(conn):
    for _ in range(6):
        pgfence.enqueue(conn, "k")
    assert scalar(conn, "SELECT count(*) FILTER (WHERE gated) FROM pgfence.jobs") == 0
    limit(conn, "k", concurrency=1)   # a limit on jobs already queued gates them
    assert list(held(conn).values()).count(None) == 1
    limit(conn, "k", concurrency=3)
    assert list(held(conn).values()).count(None) == 3
    claim(conn)
    limit(conn, "k", concurrency=1)   # lowered: the 3 holders run on, none more is admitted
    assert list(held(conn).values()).count(None) == 3
    running = [r for r, in conn.execute("SELECT id FROM pgfence.jobs WHERE status = 'running' ORDER BY id")]
    with conn.transaction():
        store.complete(conn, running[0], 1)
    assert list(held(conn).values()).count(None) == 2
    # Reset to the handler's declaration, which has none: every job free.
    admin.reset(conn, "k", by="test")
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE gated OR held_back IS NOT NULL") == 0


def test_declared_limits_are_recorded_and_a_run_time_setting_wins(conn):
    from pgfence.registry import HandlerSpec
    from pgfence.worker import kinds

    spec = HandlerSpec("export", print, concurrency=2, per_key_concurrency=1)
    assert kinds.register(conn, [spec], by="w1") == ["export"]
    assert kinds.register(conn, [spec], by="w1") == []           # unchanged: nothing written
    row = conn.execute("SELECT declared_concurrency, declared_per_key, concurrency, per_key_concurrency "
                       "FROM pgfence.limits WHERE kind = 'export'").fetchone()
    assert row == (2, 1, 2, 1)
    limit(conn, "export", concurrency=5)
    assert conn.execute("SELECT concurrency, per_key_concurrency FROM pgfence.limits").fetchone() == (5, 1)
    admin.reset(conn, "export", by="test")
    # A handler that no longer declares them: with none set either, its row goes.
    kinds.register(conn, [HandlerSpec("export", print)], by="w1")
    assert scalar(conn, "SELECT count(*) FROM pgfence.limits") == 0


def test_enqueue_many_and_sql_carry_the_key(conn):
    limit(conn, "sync", per_key=1)
    ids = pgfence.enqueue_many(conn, [{"kind": "sync", "concurrency_key": "a"}, {"kind": "sync", "concurrency_key": "a"},
                                      {"kind": "sync", "concurrency_key": "b"}, {"kind": "sync"}])
    assert held(conn) == {ids[0]: None, ids[1]: "concurrency", ids[2]: None, ids[3]: None}
    sql_id = scalar(conn, "SELECT pgfence.enqueue('sync', '{}', p_concurrency_key => 'b')")
    assert held(conn)[sql_id] == "concurrency"


def test_concurrent_enqueues_and_completions_never_admit_past_the_limit(dsn, conn):
    """Admission under READ COMMITTED: producers and completions in many
    transactions at once, committing in every order; the holders never
    exceed the limit and no slot is left unused while jobs wait."""
    limit(conn, "k", concurrency=3)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(60):
                with c.transaction():
                    pgfence.enqueue(c, "k")
                    pgfence.enqueue(c, "k")

    def consume(name: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                rows = claim(c, batch=2, worker=name)
                for row in rows:
                    with c.transaction():
                        store.complete(c, row.id, row.attempt)

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                seen.append(holders(c, "k"))

    def guarded(target, *args):
        def run():
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        return threading.Thread(target=run)

    threads = [guarded(produce), guarded(produce), guarded(consume, "c1"), guarded(consume, "c2"),
               guarded(consume, "c3"), guarded(watch)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: errors or scalar(conn, "SELECT count(*) FROM pgfence.job_history") == 240, timeout=60,
                 message="the 240 jobs done")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert max(seen) <= 3 and len(seen) > 10
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs") == 0


@pytest.mark.parametrize("concurrency", [0, -1, True, 2**31, "3"])
def test_a_bad_limit_is_refused_before_anything_is_written(conn, concurrency):
    with pytest.raises(ConfigError, match=r"^invalid concurrency: must be"):
        admin.set_limits(conn, "k", concurrency=concurrency)
    with pytest.raises(ConfigError, match=r"^handler 'k': invalid concurrency: must be"):
        pgfence.handler("k", concurrency=concurrency)
    assert scalar(conn, "SELECT count(*) FROM pgfence.limits") == 0


@pytest.mark.parametrize("key, message", [
    ("", "must not be empty"), ("x" * 201, "at most 200 characters, got 201"), ("a\nb", "must hold no control character"),
    (42, "must be a string")])
def test_a_bad_concurrency_key_is_refused_before_anything_is_written(conn, key, message):
    with pytest.raises(ConfigError, match=f"^invalid concurrency key: {message}"):
        pgfence.enqueue(conn, "k", concurrency_key=key)
    with pytest.raises(ConfigError, match=f"^job 0: invalid concurrency key: {message}"):
        pgfence.enqueue_many(conn, [{"kind": "k", "concurrency_key": key}])
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs") == 0
    # The column refuses it from SQL too.
    if isinstance(key, str):
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_concurrency_key_check"):
            conn.execute("SELECT pgfence.enqueue('k', '{}', p_concurrency_key => %s)", (key,))


def rate_of(conn, kind: str):
    return conn.execute("SELECT rate_count, rate_period FROM pgfence.limits WHERE kind = %s", (kind,)).fetchone()


def test_a_rate_admits_a_burst_then_one_start_a_step(conn):
    """5/s: a second's worth at once (GCRA's burst), then one every 0.2 s
    on the database clock, whoever admits (admit_due here)."""
    admin.set_limits(conn, "mail", rate="5/s", by="test")
    assert rate_of(conn, "mail") == (5, 1.0)
    start = scalar(conn, "SELECT clock_timestamp()")
    ids = [pgfence.enqueue(conn, "mail") for _ in range(12)]
    assert list(held(conn).values()).count(None) == 5
    # Admitted jobs not yet claimed take from the burst: none more now.
    assert limits_store.admit_due(conn) == 0
    started = [r.id for r in claim(conn)]
    assert started == ids[:5]

    def three_more() -> bool:
        limits_store.admit_due(conn)
        started.extend(r.id for r in claim(conn))
        return len(started) >= 8

    wait_for(three_more, timeout=10, interval=0.01, message="three more started at the rate")
    elapsed = scalar(conn, "SELECT extract(epoch FROM clock_timestamp() - %s)::float8", (start,))
    # Three more take three steps of 0.2 s after the burst's first.
    assert elapsed >= 0.6
    assert started == ids[:8]
    # A rate and a concurrency together: the stricter of the two.
    admin.set_limits(conn, "mail", concurrency=1, by="test")
    for job_id in ids[:8]:
        with conn.transaction():
            assert store.complete(conn, job_id, 1)
    wait_for(lambda: (limits_store.admit_due(conn), list(held(conn).values()).count(None))[1] == 1,
             timeout=10, interval=0.01, message="one admitted under the concurrency of 1")
    limits_store.admit_due(conn)
    assert list(held(conn).values()).count(None) == 1


def test_a_rate_is_declared_by_the_handler_and_set_at_run_time(conn):
    from pgfence.registry import HandlerSpec
    from pgfence.worker import kinds

    kinds.register(conn, [HandlerSpec("mail", print, rate="10/min")], by="w1")
    assert rate_of(conn, "mail") == (10, 60.0)
    listed = admin.list_limits(conn)[0]
    assert (listed["rate"], listed["declared"]["rate"], listed["set"]["rate"]) == ("10/min", "10/min", None)
    admin.set_limits(conn, "mail", rate="3/2h", by="test")
    assert rate_of(conn, "mail") == (3, 7200.0)
    assert admin.list_limits(conn)[0]["rate"] == "3/7200s"
    admin.reset(conn, "mail", by="test")
    assert rate_of(conn, "mail") == (10, 60.0)


@pytest.mark.parametrize("rate", ["0/s", "10", "ten/s", "5/fortnight", "-1/min", "1/0s", 5])
def test_a_bad_rate_is_refused_before_anything_is_written(conn, rate):
    with pytest.raises(ConfigError, match=r"^invalid rate: must be starts per period such as '100/s'"):
        admin.set_limits(conn, "mail", rate=rate, by="test")
    with pytest.raises(ConfigError, match=r"^handler 'mail': invalid rate: must be starts per period"):
        pgfence.handler("mail", rate=rate)
    assert scalar(conn, "SELECT count(*) FROM pgfence.limits") == 0


def test_a_new_rate_starts_afresh_not_on_the_old_rates_schedule(conn):
    admin.set_limits(conn, "mail", rate="5/2h", by="test")       # one start every 24 minutes
    first, second = pgfence.enqueue(conn, "mail"), pgfence.enqueue(conn, "mail")
    assert [r.id for r in claim(conn)] == [first]
    assert limits_store.admit_due(conn) == 0 and held(conn)[second] == "concurrency"
    admin.set_limits(conn, "mail", rate="10/min", by="test")
    # Admitted at once by the change (a full burst of the new rate), not in 24 minutes.
    assert held(conn)[second] is None
