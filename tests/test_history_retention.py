"""History's day partitions: created ahead by maintenance and by `pgfence
migrate`, dropped whole by retention (the default partition's old rows
deleted in batches), and dropped while workers run without losing a job or
holding up a claim."""

from __future__ import annotations

import datetime
import signal

import psycopg

from pgtools import pgfence, scalar, spawn, wait_for
from pgfence import enqueue
from pgfence.store import jobs as store
from pgfence.worker import retention


def today(conn: psycopg.Connection) -> datetime.date:
    return scalar(conn, "SELECT (now() AT TIME ZONE 'UTC')::date")


def day_name(day: datetime.date) -> str:
    return f"job_history_{day:%Y%m%d}"


def partitions(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("""
        SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'pgfence.job_history'::regclass ORDER BY 1""")]


def ahead(conn: psycopg.Connection) -> list[str]:
    """The partitions of today and the three days after it, then the default."""
    return [day_name(today(conn) + datetime.timedelta(days=d)) for d in range(4)] + ["job_history_default"]


def add_finished(conn: psycopg.Connection, days_ago: float, n: int = 1, status: str = "done") -> list[int]:
    return [r[0] for r in conn.execute("""
        INSERT INTO pgfence.job_history (kind, status, attempt, finished_at)
        SELECT 'noop', %s, 1, now() - make_interval(secs => %s * 86400) FROM generate_series(1, %s)
        RETURNING id""", (status, days_ago, n))]


def where(conn: psycopg.Connection, ids: list[int]) -> set[str]:
    """The partitions that hold these jobs."""
    return {r[0] for r in conn.execute(
        "SELECT DISTINCT tableoid::regclass::text FROM pgfence.job_history WHERE id = ANY(%s)", (ids,))}


def remove(conn: psycopg.Connection, day: datetime.date) -> None:
    assert scalar(conn, "SELECT pgfence.history_partition_remove(%s, false)", (day_name(day),))
    assert scalar(conn, "SELECT pgfence.history_partition_remove(%s, true)", (day_name(day),))


def test_prune_drops_expired_day_partitions_and_keeps_the_others(dsn, conn):
    now = today(conn)
    for days in (10, 9, 1):
        assert scalar(conn, "SELECT pgfence.history_partition_create(%s)", (now - datetime.timedelta(days=days),))
    expired = add_finished(conn, 10, n=3) + add_finished(conn, 9, n=2, status="failed")
    recent = add_finished(conn, 1, n=2, status="cancelled") + add_finished(conn, 0, n=2)
    default_old = add_finished(conn, 20)       # a day with no partition: the default one
    default_recent = add_finished(conn, 5)
    live = [enqueue(conn, "noop")]
    assert where(conn, expired) == {"pgfence." + day_name(now - datetime.timedelta(days=d)) for d in (10, 9)}
    assert where(conn, default_old + default_recent) == {"pgfence.job_history_default"}

    out = pgfence("prune", "--retention", "7d", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == \
        (0, "dropped 2 day partition(s) of history, deleted 1 finished job(s)\n", "")
    assert partitions(conn) == sorted([day_name(now - datetime.timedelta(days=1))] + ahead(conn))
    assert scalar(conn, "SELECT array_agg(id ORDER BY id) FROM pgfence.all_jobs") == \
        sorted(recent + default_recent + live)
    # No table of a dropped day is left behind, detached or not.
    assert scalar(conn, "SELECT count(*) FROM pg_class WHERE relname IN (%s, %s)",
                  tuple(day_name(now - datetime.timedelta(days=d)) for d in (10, 9))) == 0

    out = pgfence("prune", "--retention", "7d", dsn=dsn)
    assert (out.returncode, out.stdout) == (0, "dropped 0 day partition(s) of history, deleted 0 finished job(s)\n")


def test_a_detached_day_left_behind_is_dropped_at_the_next_round(conn):
    old = today(conn) - datetime.timedelta(days=30)
    assert scalar(conn, "SELECT pgfence.history_partition_create(%s)", (old,))
    add_finished(conn, 30, n=5)
    assert scalar(conn, "SELECT pgfence.history_partition_remove(%s, false)", (day_name(old),))   # then a crash
    assert retention.maintain(conn, 7 * 86400) == retention.Maintained(created=0, dropped=1, deleted=0)
    assert scalar(conn, "SELECT to_regclass(%s)", ("pgfence." + day_name(old),)) is None


def test_the_default_partition_is_pruned_in_batches_oldest_first(conn, monkeypatch):
    old = [add_finished(conn, 20 + (10 - i) / 1440)[0] for i in range(10)]   # oldest first
    keep = add_finished(conn, 0, status="failed") + [enqueue(conn, "noop")]
    assert where(conn, old) == {"pgfence.job_history_default"}

    def ids() -> list[int]:
        return [r[0] for r in conn.execute("SELECT id FROM pgfence.all_jobs ORDER BY id")]

    assert retention.prune_once(conn, 3600, batch=3) == 3
    assert ids() == sorted(old[3:] + keep)          # the three oldest went first

    batches: list[int] = []
    real = retention.prune_once

    def counting(*args, **kwargs):
        deleted = real(*args, **kwargs)
        batches.append(deleted)
        return deleted

    monkeypatch.setattr(retention, "prune_once", counting)
    assert retention.prune(conn, 3600, batch=3, max_batches=1) == 3     # bounded by max_batches
    assert batches == [3]
    assert retention.prune(conn, 3600, batch=2) == 4
    assert batches == [3, 2, 2, 0]                        # a short batch ends the run
    assert ids() == sorted(keep)


def test_partitions_are_created_ahead_by_the_workers_and_by_migrate(dsn, conn):
    assert partitions(conn) == ahead(conn)
    for days in (1, 2, 3):
        remove(conn, today(conn) + datetime.timedelta(days=days))
    assert partitions(conn) == [day_name(today(conn)), "job_history_default"]

    worker = spawn("work", "--prune-interval", "0.05", "--retention", "none", dsn=dsn)
    try:
        wait_for(lambda: partitions(conn) == ahead(conn), timeout=30, message="the partitions ahead")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert worker.returncode == 0

    remove(conn, today(conn) + datetime.timedelta(days=3))
    out = pgfence("migrate", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "schema up to date\n", "")
    assert partitions(conn) == ahead(conn)
    # Nothing to do: nothing created.
    assert retention.ensure_partitions(conn) == 0


def test_a_completion_without_its_day_partition_lands_in_the_default_one(conn, make_worker):
    remove(conn, today(conn))
    job_id = enqueue(conn, "noop")
    [job] = make_worker().claim(1)
    assert store.complete(conn, job_id, job.attempt)
    assert where(conn, [job_id]) == {"pgfence.job_history_default"}
    # Maintenance cannot attach today's partition over the default's rows of
    # today: it leaves them there, says so, and creates the days ahead.
    assert retention.ensure_partitions(conn) == 0
    remove(conn, today(conn) + datetime.timedelta(days=1))
    assert retention.ensure_partitions(conn) == 1
    assert day_name(today(conn)) not in partitions(conn)
    assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done"


def test_dropping_a_partition_while_workers_run_loses_nothing_and_blocks_no_claim(dsn, conn):
    old = today(conn) - datetime.timedelta(days=10)
    assert scalar(conn, "SELECT pgfence.history_partition_create(%s)", (old,))
    add_finished(conn, 10, n=20000)
    proc = spawn("run", "--workers", "2", "--retention", "none", dsn=dsn)
    try:
        first = [enqueue(conn, "noop") for _ in range(100)]

        def done(ids: list[int]) -> int:
            return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s) AND status = 'done'",
                          (ids,))

        wait_for(lambda: done(first) == 100, timeout=60, message="the first jobs done")
        with psycopg.connect(dsn) as holder:
            # The detach holds history's ACCESS EXCLUSIVE lock until commit.
            assert holder.execute("SELECT pgfence.history_partition_remove(%s, false)", (day_name(old),)).fetchone()[0]
            more = [enqueue(conn, "noop") for _ in range(20)]
            # Claims go on (they read and write pgfence.jobs alone): each of
            # the two workers claims a job, whose completion then waits for
            # the lock.  The view would wait too: read the hot table.
            wait_for(lambda: scalar(conn, """SELECT count(*) FROM pgfence.jobs
                                              WHERE id = ANY(%s) AND status = 'running'""", (more,)) == 2,
                     timeout=30, message="two claims while history is locked")
            holder.commit()
        assert scalar(conn, "SELECT pgfence.history_partition_remove(%s, true)", (day_name(old),))
        later = [enqueue(conn, "noop") for _ in range(100)]
        every = first + more + later
        wait_for(lambda: done(every) == len(every), timeout=60, message="every job done")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    # Each job done exactly once, at its first attempt; nothing left live,
    # and the old day's jobs went with their partition.
    assert conn.execute("""SELECT count(*), count(DISTINCT id), min(attempt), max(attempt)
                             FROM pgfence.job_history WHERE id = ANY(%s)""", (every,)).fetchone() == \
        (len(every), len(every), 1, 1)
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs") == 0
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history") == len(every)
