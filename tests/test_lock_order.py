"""Multi-row owner statements lock jobs in one order (by id); a deadlock or
serialization failure is run again, and database errors are translated by
their SQLSTATE class (issue 10, points 4 and 17).  Real PostgreSQL, real
lock waits: each step waits for the server to show the session blocked."""

from __future__ import annotations

import os
import threading

import psycopg
import pytest
from pgtools import job_row, scalar, wait_for, with_dbname

from pgfence.store import client as client_store
from pgfence.store import db
from pgfence.errors import (DatabaseError, DatabaseUnavailable, StatementCanceled, TransactionConflict)
from pgfence.store.queries import q


def enqueue(conn, n: int, queue: str = "default") -> list[int]:
    return [client_store.enqueue(conn, {"kind": "noop", "payload": "{}", "queue": queue, "priority": 0,
                                        "run_at": None, "delay": 0.0, "max_attempts": 5, "dedupe_key": None,
                                        "max_reclaims": 3}) for _ in range(n)]


def claim_all(conn, n: int, worker: str = "w1") -> list[tuple[int, int]]:
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": n, "worker": worker, "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": False, "kinds": None, "not_kinds": None}).fetchall()
    return sorted((r[0], r[5]) for r in rows)


def waiting_on_lock(conn, pid: int) -> bool:
    return scalar(conn, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)) is True


def many_running(conn, n: int = 2000) -> list[tuple[int, int]]:
    """Claim ``n`` jobs and ANALYZE: with that many running jobs PostgreSQL
    plans the multi-row statements as a nested loop driven by the id array
    (each job looked up by its primary key), so a statement that locked rows
    as its join yields them locked them in the order of the array."""
    conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, %s)", (n,))
    claimed = claim_all(conn, n)
    conn.execute("ANALYZE pgfence.jobs")
    return claimed


def quick_deadlocks(c: psycopg.Connection) -> None:
    c.execute("SET deadlock_timeout = '100ms'")


class Background:
    """Run one statement on its own connection in a thread; keep its result
    or its error."""

    def __init__(self, conn: psycopg.Connection, func):
        self.conn, self.result, self.error = conn, None, None
        self.thread = threading.Thread(target=self._run, args=(func,), daemon=True)
        self.thread.start()

    def _run(self, func) -> None:
        try:
            self.result = func(self.conn)
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            self.error = exc

    def join(self) -> None:
        self.thread.join(20)
        assert not self.thread.is_alive()


def test_renewal_and_batched_completion_lock_jobs_in_one_order(dsn, conn):
    """The heartbeat renews [a, b] while a worker completes [b, a] (the
    arrays in opposite orders, as the shared slot table made them every
    other batch).  A third session holds a, so the renewal queues on a
    first; the completion then comes.  Locking in array order, the
    completion took b and waited for a, the renewal got a and waited for b:
    a deadlock.  Locking by id, both wait for a and run one after the other."""
    (a, att_a), (b, att_b) = many_running(conn)[:2]
    with psycopg.connect(dsn, autocommit=True) as renewer, psycopg.connect(dsn, autocommit=True) as completer, \
            psycopg.connect(dsn) as holder:
        for c in (renewer, completer):
            quick_deadlocks(c)
        holder.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE", (a,))
        renew = Background(renewer, lambda c: sorted(c.execute(q("renew"), {
            "ids": db.array_literal([a, b]), "attempts": db.array_literal([att_a, att_b]),
            "leases": db.array_literal([60.0, 60.0])}).fetchall()))
        wait_for(lambda: waiting_on_lock(conn, renewer.info.backend_pid), timeout=10, message="renewal waits for a")
        complete = Background(completer, lambda c: sorted(r[0] for r in c.execute(q("complete_many"), {
            "ids": db.array_literal([b, a]), "attempts": db.array_literal([att_b, att_a]), "results": None})))
        wait_for(lambda: waiting_on_lock(conn, completer.info.backend_pid), timeout=10,
                 message="completion waits")
        holder.commit()
        renew.join()
        complete.join()
    assert (renew.error, complete.error) == (None, None)
    assert renew.result == [(a, att_a), (b, att_b)]
    assert complete.result == [a, b]
    assert [job_row(conn, i)["status"] for i in (a, b)] == ["done", "done"]


def test_cancel_and_renewal_lock_jobs_in_one_order(dsn, conn):
    """An operator cancels [a, b] while the heartbeat renews [b, a]; a third
    session holds a, so the cancel queues on a first.  The renewal, locking
    in array order, took b and waited for a; the cancel, given a, waited for
    b: a deadlock.  Locking by id, both queue on a."""
    (a, att_a), (b, att_b) = many_running(conn)[:2]
    with psycopg.connect(dsn, autocommit=True) as renewer, psycopg.connect(dsn, autocommit=True) as canceller, \
            psycopg.connect(dsn) as holder:
        for c in (renewer, canceller):
            quick_deadlocks(c)
        holder.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE", (a,))
        cancel = Background(canceller, lambda c: sorted(r[0] for r in c.execute(q("cancel_ids"), {"ids": [a, b]})))
        wait_for(lambda: waiting_on_lock(conn, canceller.info.backend_pid), timeout=10, message="cancel waits for a")
        renew = Background(renewer, lambda c: sorted(c.execute(q("renew"), {
            "ids": db.array_literal([b, a]), "attempts": db.array_literal([att_b, att_a]),
            "leases": db.array_literal([60.0, 60.0])}).fetchall()))
        wait_for(lambda: waiting_on_lock(conn, renewer.info.backend_pid), timeout=10, message="renewal waits")
        holder.commit()
        renew.join()
        cancel.join()
    assert (renew.error, cancel.error) == (None, None)
    assert cancel.result == [a, b]
    assert renew.result == []          # cancelled first: nothing left to renew
    assert [job_row(conn, i)["status"] for i in (a, b)] == ["cancelled", "cancelled"]


def test_batched_completion_chosen_as_deadlock_victim_runs_again(dsn, conn, make_worker):
    """Another session makes a real deadlock with the worker's complete_many
    (it holds b, then asks for a, which the completion holds).  The server
    aborts the completion (40P01): it is run again at once and completes
    both jobs, instead of dropping the connection as "database unreachable"
    and leaving the jobs to run a second time."""
    enqueue(conn, 2)
    worker = make_worker()
    jobs = worker.claim(batch=2)
    a, b = sorted(job.id for job in jobs)
    worker.conn.execute("SET deadlock_timeout = '200ms'")   # the worker detects the cycle: it is the victim
    with psycopg.connect(dsn) as other:
        other.execute("SET deadlock_timeout = '30s'")
        other.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE", (b,))
        complete = Background(None, lambda _c: worker.complete_deferred(list(jobs)))
        wait_for(lambda: waiting_on_lock(conn, worker.conn.info.backend_pid), timeout=10,
                 message="completion holds a, waits for b")
        other.execute("SELECT id FROM pgfence.jobs WHERE id = %s FOR UPDATE", (a,))   # the cycle
        other.commit()
        complete.join()
    assert complete.error is None
    assert complete.result == 2
    assert worker.stats.outcomes == {"done": 2}
    assert [job_row(conn, i)["status"] for i in (a, b)] == ["done", "done"]
    assert worker._conn is not None and not worker._conn.closed   # the connection was kept


def test_retrying_runs_a_conflict_again_and_gives_up_after_its_tries():
    calls = []

    def deadlocked():
        calls.append(1)
        if len(calls) < 3:
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return "ok"

    assert db.retrying(deadlocked) == "ok"
    assert len(calls) == 3

    calls.clear()

    def always():
        calls.append(1)
        raise psycopg.errors.SerializationFailure("could not serialize access")

    with pytest.raises(TransactionConflict, match="could not serialize access"):
        db.retrying(always, tries=4)
    assert len(calls) == 4

    calls.clear()

    def data_error():
        calls.append(1)
        raise psycopg.errors.DivisionByZero("division by zero")

    with pytest.raises(DatabaseError) as info:
        db.retrying(data_error)
    assert len(calls) == 1 and not isinstance(info.value, DatabaseUnavailable)


# -- errors by class (point 17) --------------------------------------------------


def translated(dsn, func):
    with psycopg.connect(dsn, autocommit=True) as c:
        with pytest.raises(DatabaseError) as info, db.translated(dsn):
            func(c)
    return info.value


def test_a_statement_timeout_is_statement_canceled_not_unreachable(dsn):
    err = translated(dsn, lambda c: (c.execute("SET statement_timeout = '50ms'"), c.execute("SELECT pg_sleep(5)")))
    assert type(err) is StatementCanceled
    assert err.sqlstate == "57014"
    assert str(err) == "statement canceled: canceling statement due to statement timeout (SQLSTATE 57014)"


def test_an_index_row_too_big_is_a_database_error_with_the_servers_message(dsn):
    key = os.urandom(2100).hex()   # random, so that the index cannot compress it
    err = translated(dsn, lambda c: client_store.enqueue(c, {
        "kind": "noop", "payload": "{}", "queue": "default", "priority": 0, "run_at": None, "delay": 0.0,
        "max_attempts": 5, "dedupe_key": key, "max_reclaims": 3}))
    assert type(err) is DatabaseError
    assert err.sqlstate == "54000"
    assert str(err).startswith("database error: index row size ")
    assert str(err).endswith("(SQLSTATE 54000)")


def test_a_serialization_failure_is_a_transaction_conflict(dsn, conn):
    enqueue(conn, 1)
    with psycopg.connect(dsn) as one, psycopg.connect(dsn) as two:
        for c in (one, two):
            c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            c.execute("SELECT count(*) FROM pgfence.all_jobs")
        one.execute("UPDATE pgfence.jobs SET priority = 1")
        done = Background(two, lambda c: c.execute("UPDATE pgfence.jobs SET priority = 2"))
        wait_for(lambda: waiting_on_lock(conn, two.info.backend_pid), timeout=10, message="two waits for one")
        one.commit()
        done.join()
    err = db.translate(done.error)
    assert type(err) is TransactionConflict
    assert err.sqlstate == "40001"
    assert str(err) == ("transaction conflict: could not serialize access due to concurrent update "
                        "(SQLSTATE 40001)")


def test_a_terminated_session_and_a_closed_port_are_unreachable(dsn, conn):
    with psycopg.connect(dsn, autocommit=True) as victim:
        conn.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        with pytest.raises(DatabaseUnavailable, match=r"^database unreachable \("), db.translated(dsn):
            victim.execute("SELECT 1")
    with pytest.raises(DatabaseUnavailable, match=r"^database unreachable \(.*port=1\b"):
        db.connect("postgresql://postgres@127.0.0.1:1/x")
    # A missing database is a failure to connect too.
    with pytest.raises(DatabaseUnavailable, match="does not exist"):
        db.connect(with_dbname(dsn, "pgfence_no_such_db"))
