"""The scheduler against a real PostgreSQL, without supervisors: schedulers
racing for the same ticks, the database's key, catch-up, overlap, the tick's
job as its handler sees it.  Rounds are driven by hand: each waits until the
database's clock has passed the tick it is about (a deadline, not a sleep).
The same behaviour through real `pgfence run` supervisors is in
test_periodic_run.py."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgtools import scalar, finish, wait_for
from pgfence import enqueue, registry
from pgfence.errors import ConfigError
from pgfence.observe import metrics
from pgfence.scheduling.schedule import Schedule
from pgfence.scheduling.scheduler import Scheduler
from pgfence.store import periodic as ticks


@pytest.fixture
def schedulers(dsn):
    made: list[Scheduler] = []

    def make(*schedules: Schedule, grace: float = 10.0) -> Scheduler:
        scheduler = Scheduler(dsn, list(schedules), grace=grace)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.stop()


def db_now(conn) -> datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def wait_db_past(conn, at: datetime, timeout: float = 15.0) -> None:
    wait_for(lambda: db_now(conn) > at, timeout=timeout, interval=0.01, message=f"the database's clock past {at}")


def tick_rows(conn, schedule: str) -> list[tuple]:
    return conn.execute("SELECT tick, outcome, job_id FROM pgfence.schedule_ticks WHERE schedule = %s ORDER BY tick",
                        (schedule,)).fetchall()


def jobs_of(conn, schedule: str) -> list[tuple]:
    return conn.execute("SELECT id, dedupe_key, status FROM pgfence.all_jobs WHERE dedupe_key LIKE %s ORDER BY id",
                        (f"pgfence:periodic:{schedule}:%",)).fetchall()


def ticks_total(name: str, outcome: str) -> float:
    return metrics.PERIODIC_TICKS.labels(name, outcome)._value.get()


# -- exactly once -----------------------------------------------------------------------


def test_racing_schedulers_with_skewed_host_clocks_enqueue_each_tick_once(dsn, conn, monkeypatch):
    """Four schedulers, their host clocks off by -30 s, 0, +30 s and an hour,
    run rounds as fast as they can for 5 seconds of an every-second
    schedule: each tick has one row and one job, and none is missing."""
    schedule = Schedule("race", "noop", every=1, overlap="allow")   # no worker runs the jobs here
    made = []
    for offset in ("-30", "0", "30", "3600"):
        monkeypatch.setenv("PGFENCE_TEST_HOST_CLOCK_OFFSET", offset)
        made.append(Scheduler(dsn, [schedule], grace=10.0))
    assert [s.offset for s in made] == [-30.0, 0.0, 30.0, 3600.0]
    made[0].declare()
    start = db_now(conn)
    stop = threading.Event()
    errors: list[BaseException] = []

    def hammer(scheduler: Scheduler) -> None:
        try:
            while not stop.is_set():
                scheduler.run_once()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(s,)) for s in made]
    for thread in threads:
        thread.start()
    try:
        wait_db_past(conn, start + timedelta(seconds=5))
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for scheduler in made:
            scheduler.stop()
    assert errors == []
    end = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'race'")
    expected = list(schedule.ticks(start, end))
    assert len(expected) >= 5
    rows = tick_rows(conn, "race")
    assert [r[0] for r in rows if r[0] > start] == expected
    assert {r[1] for r in rows} == {"enqueued"}
    jobs = jobs_of(conn, "race")
    assert [j[1] for j in jobs] == [schedule.dedupe_key(r[0]) for r in rows]
    assert sorted(j[0] for j in jobs) == sorted(r[2] for r in rows)


def test_the_database_refuses_a_second_row_for_a_tick_and_its_job_with_it(dsn, conn):
    """The key is the database's: a second enqueue of one tick fails, and
    rolls back the job it would have added."""
    schedule = Schedule("once", "noop", every=60)
    tick = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    with psycopg.connect(dsn, autocommit=True) as other:
        ticks.declare(other, schedule)
        with other.transaction():
            first, _lag = ticks.enqueue(other, schedule, tick)
        with pytest.raises(psycopg.errors.UniqueViolation), other.transaction():
            ticks.enqueue(other, schedule, tick)
    assert tick_rows(conn, "once") == [(tick, "enqueued", first)]
    assert [j[0] for j in jobs_of(conn, "once")] == [first]


# -- catch-up ------------------------------------------------------------------------------


def test_after_downtime_latest_none_and_all_catch_up_as_declared(conn, schedulers):
    """No scheduler ran for 21 seconds (checked_until set back, as a stop
    leaves it): of the ticks of an every-4s schedule in the gap, latest
    enqueues the most recent, none none, all (overlap allow) every one."""
    made = [Schedule("cu-latest", "noop", every=4, catch_up="latest"),
            Schedule("cu-none", "noop", every=4, catch_up="none"),
            Schedule("cu-all", "noop", every=4, catch_up="all", overlap="allow")]
    scheduler = schedulers(*made)
    scheduler.declare()
    conn.execute("UPDATE pgfence.schedules SET checked_until = clock_timestamp() - interval '21 seconds'")
    gap_start = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'cu-all'")
    before = {s.name: ticks_total(s.name, "missed") for s in made}
    result = scheduler.run_once()
    gap_end = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'cu-all'")
    gap = list(made[0].ticks(gap_start, gap_end))
    assert len(gap) in (5, 6)
    assert sorted(result.decided) == ["cu-all", "cu-latest", "cu-none"]
    assert [r[0] for r in tick_rows(conn, "cu-latest")] == [gap[-1]]
    assert tick_rows(conn, "cu-none") == []
    assert [r[0] for r in tick_rows(conn, "cu-all")] == gap
    assert len(jobs_of(conn, "cu-all")) == len(gap) and len(jobs_of(conn, "cu-latest")) == 1
    missed = dict(conn.execute("SELECT name, missed_ticks FROM pgfence.schedules").fetchall())
    assert missed == {"cu-latest": len(gap) - 1, "cu-none": len(gap), "cu-all": 0}
    assert {s.name: ticks_total(s.name, "missed") - before[s.name] for s in made} == {
        "cu-latest": len(gap) - 1, "cu-none": len(gap), "cu-all": 0}


def test_a_new_schedule_owes_no_tick_before_its_declaration_and_a_restart_keeps_its_place(conn, schedulers):
    schedule = Schedule("fresh", "noop", every=1)
    first = schedulers(schedule)
    first.declare()
    declared = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'fresh'")
    first.run_once()
    assert all(r[0] > declared for r in tick_rows(conn, "fresh"))
    wait_db_past(conn, declared + timedelta(seconds=2))
    first.run_once()
    checked = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'fresh'")
    # A second supervisor starting (or this one reloading) declares it again:
    # the place is kept, nothing is decided twice.
    second = schedulers(schedule)
    second.declare()
    assert scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'fresh'") == checked
    second.run_once()
    rows = tick_rows(conn, "fresh")
    assert [r[0] for r in rows] == list(schedule.ticks(declared, rows[-1][0]))


# -- overlap ---------------------------------------------------------------------------------


def test_overlap_skip_records_ticks_while_the_run_is_outstanding(conn, schedulers):
    schedule = Schedule("sk", "noop", every=1, overlap="skip")
    scheduler = schedulers(schedule)
    scheduler.declare()
    skipped_before = ticks_total("sk", "skipped")
    start = db_now(conn)
    first_tick = schedule.next_tick(start)
    wait_db_past(conn, first_tick)
    scheduler.run_once()
    [(tick, outcome, job_id)] = tick_rows(conn, "sk")
    assert (tick, outcome) == (first_tick, "enqueued")
    # The job stays queued: the next two ticks are skipped.
    wait_db_past(conn, first_tick + timedelta(seconds=2))
    scheduler.run_once()
    rows = tick_rows(conn, "sk")
    assert [(r[0], r[1]) for r in rows[1:3]] == [(first_tick + timedelta(seconds=1), "skipped"),
                                                 (first_tick + timedelta(seconds=2), "skipped")]
    assert jobs_of(conn, "sk") == [(job_id, schedule.dedupe_key(first_tick), "queued")]
    assert ticks_total("sk", "skipped") - skipped_before == len(rows) - 1
    # The run ends: the next tick is enqueued.
    finish(conn, job_id)
    last = rows[-1][0]
    wait_db_past(conn, last + timedelta(seconds=1))
    scheduler.run_once()
    rows = tick_rows(conn, "sk")
    assert rows[-1][1] == "enqueued" and rows[-1][0] > last
    assert scalar(conn, "SELECT last_job_id FROM pgfence.schedules WHERE name = 'sk'") == rows[-1][2]


def test_overlap_queue_enqueues_queued_ticks_one_after_another_in_tick_order(conn, schedulers):
    schedule = Schedule("qu", "noop", every=1, overlap="queue")
    scheduler = schedulers(schedule)
    scheduler.declare()
    first_tick = schedule.next_tick(db_now(conn))
    wait_db_past(conn, first_tick + timedelta(seconds=2))
    scheduler.run_once()
    rows = tick_rows(conn, "qu")
    assert [r[1] for r in rows] == ["enqueued"] + ["queued"] * (len(rows) - 1)
    assert len(rows) >= 3
    queued = [r[0] for r in rows[1:]]
    for tick in queued[:2]:
        # The outstanding run ends; the oldest queued tick takes its turn.
        finish(conn, scalar(conn, "SELECT last_job_id FROM pgfence.schedules WHERE name = 'qu'"))
        scheduler.run_once()
        job_id = scalar(conn, "SELECT last_job_id FROM pgfence.schedules WHERE name = 'qu'")
        assert scalar(conn, "SELECT dedupe_key FROM pgfence.jobs WHERE id = %s", (job_id,)) == \
            schedule.dedupe_key(tick)
        assert scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE dedupe_key LIKE 'pgfence:periodic:qu:%%'") == 1


# -- the job as its handler sees it ------------------------------------------------------------


def test_a_ticks_job_knows_its_schedule_and_tick_and_its_key_comes_from_them(dsn, conn, schedulers, make_worker):
    seen = []

    @registry.handler("report_tick")
    def report(job):
        seen.append((job.schedule, job.scheduled_for, job.idempotency_key, job.payload))

    schedule = Schedule("nightly-ish", "report_tick", every=1, payload={"size": 3})
    scheduler = schedulers(schedule)
    scheduler.declare()
    tick = schedule.next_tick(db_now(conn))
    wait_db_past(conn, tick)
    scheduler.run_once()
    worker = make_worker()
    assert worker.run_once() == 1
    assert seen == [("nightly-ish", tick, f"pgfence:periodic:nightly-ish:{tick.isoformat()}", {"size": 3})]
    [(job_id, _key, status)] = jobs_of(conn, "nightly-ish")
    assert status == "done"


def test_enqueue_refuses_the_dedupe_keys_of_schedules(conn):
    with pytest.raises(ConfigError, match="reserved for the jobs of schedules"):
        enqueue(conn, "noop", {}, dedupe_key="pgfence:periodic:nightly:2026-01-01T00:00:00+00:00")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0


# -- gauges and housekeeping ---------------------------------------------------------------------


def test_last_run_failed_follows_the_last_run_that_ended(conn, schedulers):
    """1 once the newest tick's job failed; kept while the next tick's job
    is queued (it has not ended); 0 once a later run ends done."""
    schedule = Schedule("lr", "noop", every=1, overlap="allow")
    scheduler = schedulers(schedule)
    scheduler.declare()
    gauge = metrics.PERIODIC_LAST_RUN_FAILED.labels("lr")

    def next_job(after: int | None) -> int:
        wait_for(lambda: scheduler.run_once() and
                 scalar(conn, "SELECT last_job_id FROM pgfence.schedules WHERE name = 'lr'") not in (None, after),
                 timeout=10, message="a new tick's job")
        return scalar(conn, "SELECT last_job_id FROM pgfence.schedules WHERE name = 'lr'")

    def refreshed() -> float:
        scheduler._refresh_last_runs(scheduler.connection())
        return gauge._value.get()

    first = next_job(None)
    assert refreshed() == 0.0                      # queued: nothing has ended yet
    finish(conn, first, "failed")
    assert refreshed() == 1.0
    second = next_job(first)
    assert refreshed() == 1.0                      # its job is queued: the failed run still speaks
    finish(conn, second, "done")
    assert refreshed() == 0.0


def test_old_ticks_are_pruned_but_queued_ones_wait_for_their_turn(conn):
    conn.execute("""INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome, decided_at) VALUES
                    ('p', '2026-01-01 00:00+00', 'skipped', now() - interval '8 days'),
                    ('p', '2026-01-01 00:01+00', 'queued', now() - interval '8 days'),
                    ('p', '2026-01-01 00:02+00', 'skipped', now() - interval '1 day')""")
    assert ticks.prune(conn, retention=7 * 86400) == 1
    assert [(r[0].minute, r[1]) for r in tick_rows(conn, "p")] == [(1, "queued"), (2, "skipped")]


def test_the_scheduler_thread_runs_until_stopped(conn, schedulers):
    schedule = Schedule("thread", "noop", every=1)
    scheduler = schedulers(schedule)
    scheduler.start()
    wait_for(lambda: len(tick_rows(conn, "thread")) >= 2, timeout=10, message="two ticks from the thread")
    scheduler.stop()
    assert scheduler._thread is not None and not scheduler._thread.is_alive()
    count = len(tick_rows(conn, "thread"))
    checked = scalar(conn, "SELECT checked_until FROM pgfence.schedules WHERE name = 'thread'")
    wait_db_past(conn, checked + timedelta(seconds=1.5))
    assert len(tick_rows(conn, "thread")) == count


def test_pgfence_prune_deletes_old_ticks_with_old_history(dsn, conn):
    from pgtools import pgfence

    conn.execute("""INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome, decided_at)
                    SELECT 'p', '2026-01-01 00:00+00'::timestamptz + n * interval '1 second', 'skipped',
                           now() - interval '8 days'
                      FROM generate_series(1, 3) n""")
    out = pgfence("prune", "--retention", "7d", dsn=dsn)
    assert (out.returncode, out.stdout) == (
        0, "dropped 0 day partition(s) of history, deleted 0 finished job(s), deleted 3 tick(s) of schedules\n")
    assert tick_rows(conn, "p") == []
