"""The heartbeat manager against a real PostgreSQL: one renewal statement per
round for any number of leases, renewals fenced by attempt, leases given up
on time when the database cannot be reached, timeouts, and the metrics.

Local deadlines are ``time.monotonic`` values; every test that bounds one
reads the clock itself around the round it makes the manager run.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtools import job_row, scalar, wait_for, with_dbname
from pgfence import LeaseLost, enqueue
from pgfence.renewal.renewer import HeartbeatManager
from pgfence.job import Job
from pgfence.worker.lease import Lease
from pgfence.store.queries import q

HEARTBEAT_APP = "pgfence heartbeat"


# -- helpers ------------------------------------------------------------------


def claim(conn, worker: str, *, queue: str, lease: float = 30.0, batch: int = 1) -> list[tuple[int, int, str]]:
    """Run the real claim query; return (id, attempt, prev_status) per job."""
    rows = conn.execute(q("claim"), {
        "queues": [queue], "batch": batch, "worker": worker, "lease": lease,
        "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None,
    }).fetchall()
    return sorted((r[0], r[5], r[14]) for r in rows)


def claim_one(conn, worker: str, *, queue: str, kind: str = "effect", lease: float = 30.0) -> tuple[int, Lease]:
    """Enqueue one job, claim it as attempt 1; return its id and a held lease."""
    job_id = enqueue(conn, kind, {"seconds": 0}, queue=queue)
    sent_at = time.monotonic()
    assert claim(conn, worker, queue=queue, lease=lease) == [(job_id, 1, "queued")]
    return job_id, Lease(job_id, 1, lease, queue, kind, deadline=sent_at + lease)


def expire(conn, job_id: int) -> None:
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))


def lease_until(conn, job_id: int):
    return scalar(conn, "SELECT lease_until FROM pgfence.all_jobs WHERE id = %s", (job_id,))


def lost_total(queue: str, kind: str, reason: str) -> float:
    value = REGISTRY.get_sample_value("pgfence_lease_lost_total", {"queue": queue, "kind": kind, "reason": reason})
    return value or 0.0


def job_for(lease: Lease) -> Job:
    return Job(lease.id, lease.kind, lease.queue, lease.attempt, {}, lease)


def check_reason(job: Job) -> str | None:
    """The reason job.check() raises with, or None when it does not raise."""
    try:
        job.check()
    except LeaseLost as exc:
        assert (exc.job_id, exc.attempt) == (job.id, job.attempt)
        return exc.reason
    return None


def heartbeat_backends(conn) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
        (HEARTBEAT_APP,))]


def terminate_heartbeat(conn) -> None:
    pids = heartbeat_backends(conn)
    assert len(pids) == 1, pids
    assert scalar(conn, "SELECT pg_terminate_backend(%s)", (pids[0],)) is True
    wait_for(lambda: pids[0] not in heartbeat_backends(conn), timeout=10, message="heartbeat backend gone")


@pytest.fixture
def managers():
    """Make HeartbeatManagers that are always stopped (pool closed) at the end."""
    made: list[HeartbeatManager] = []

    def make(dsn: str, **kwargs) -> HeartbeatManager:
        manager = HeartbeatManager(dsn, **kwargs)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.stop()


def wait_marked(lease: Lease, timeout: float) -> float:
    """Poll lease.lost_reason (never lease.lost(), which would mark the lease
    itself) and return the monotonic time the mark was first seen."""
    deadline = time.monotonic() + timeout
    while lease.lost_reason is None:
        if time.monotonic() >= deadline:
            raise AssertionError(f"lease not marked lost within {timeout}s")
        time.sleep(0.005)
    return time.monotonic()


def wait_check_raises(job: Job, timeout: float) -> tuple[float, str]:
    """Call job.check() until it raises; return the time and the reason."""
    deadline = time.monotonic() + timeout
    while True:
        reason = check_reason(job)
        if reason is not None:
            return time.monotonic(), reason
        if time.monotonic() >= deadline:
            raise AssertionError(f"job.check() did not raise within {timeout}s")
        time.sleep(0.005)


#: How late a poll may observe a mark that happened at the deadline.
POLL_SLACK = 0.2


# -- one statement per round ----------------------------------------------------


def test_many_leases_are_renewed_by_one_statement_per_round(dsn, conn, managers):
    queue = "hb-batch"
    ids = [enqueue(conn, "effect", {}, queue=queue) for _ in range(25)]
    claimed = claim(conn, "w1", queue=queue, lease=30.0, batch=25)
    assert claimed == [(i, 1, "queued") for i in ids]
    before = {i: lease_until(conn, i) for i in ids}
    # Every lease its own length, so the rows tell whether they were renewed
    # by one statement: then lease_until - length is the same now() for all.
    leases = [Lease(i, 1, 40.0 + n, queue, "effect", deadline=time.monotonic() + 30) for n, i in enumerate(ids)]
    manager = managers(dsn, default_lease=40.0)
    for lease in leases:
        manager.track(lease)

    t0 = time.monotonic()
    result = manager.run_once()
    t1 = time.monotonic()

    assert manager.statements == 1
    assert (result.sent, result.renewed, result.lost, result.error) == (25, 25, {}, None)
    rows = conn.execute(
        "SELECT id, lease_until, lease_until - make_interval(secs => 40 + (row_number() OVER (ORDER BY id) - 1))"
        "  FROM pgfence.all_jobs WHERE queue = %s ORDER BY id", (queue,)).fetchall()
    assert [r[0] for r in rows] == ids
    assert all(r[1] > before[r[0]] for r in rows)
    renewed_at = {r[2] for r in rows}
    assert len(renewed_at) == 1, renewed_at
    for lease in leases:
        assert t0 + lease.seconds <= lease.deadline <= t1 + lease.seconds
        assert lease.lost_reason is None

    second = manager.run_once()
    assert manager.statements == 2
    assert (second.sent, second.renewed) == (25, 25)
    again = {r[0] for r in conn.execute(
        "SELECT lease_until - make_interval(secs => 40 + (row_number() OVER (ORDER BY id) - 1))"
        "  FROM pgfence.all_jobs WHERE queue = %s", (queue,))}
    assert len(again) == 1 and again.pop() > renewed_at.pop()


def test_a_lease_seen_only_after_a_round_does_not_bring_the_next_round_forward(dsn, conn, managers):
    """A lease is due a period after its claim was sent, but a worker
    publishes it only once the claim has returned: one claimed just before a
    round and seen just after it must not call the next round early (with
    claims coming all the time, every round would come early and there would
    be more statements than intervals).  One claimed so long before that
    waiting would leave it less than a period before its deadline is
    renewed a period before its deadline."""
    queue = "hb-spacing"
    ids = [enqueue(conn, "effect", {}, queue=queue) for _ in range(3)]
    assert len(claim(conn, "w1", queue=queue, lease=30.0, batch=3)) == 3
    manager = managers(dsn, default_lease=3.0)   # a period of 1 s
    now = time.monotonic()
    seen = Lease(ids[0], 1, 3.0, queue, "effect", deadline=now + 3.0, claimed_at=now)
    manager.track(seen)
    assert manager.run_once().sent == 1
    sent = seen.renewed_at
    late = Lease(ids[1], 1, 3.0, queue, "effect", deadline=sent - 0.4 + 3.0, claimed_at=sent - 0.4)
    assert manager.next_round([seen, late], sent) == pytest.approx(sent + 1.0, abs=1e-6)
    old = Lease(ids[2], 1, 3.0, queue, "effect", deadline=sent - 1.5 + 3.0, claimed_at=sent - 1.5)
    assert manager.next_round([seen, late, old], sent) == pytest.approx(sent + 0.5, abs=1e-6)


def test_round_without_leases_sends_no_statement(dsn, managers):
    manager = managers(dsn, default_lease=3.0)
    result = manager.run_once()
    assert (result.sent, result.renewed, result.lost, result.error) == (0, 0, {}, None)
    assert manager.statements == 0


# -- renewals are fenced --------------------------------------------------------


def test_renewal_by_a_reclaimed_attempt_touches_no_row(dsn, conn, managers):
    queue = "hb-reclaimed"
    job_id, old = claim_one(conn, "old-owner", queue=queue)
    expire(conn, job_id)
    assert claim(conn, "new-owner", queue=queue, lease=30.0) == [(job_id, 2, "running")]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("running", 2, "new-owner")
    manager = managers(dsn, default_lease=30.0)
    manager.track(old)
    lost_before = lost_total(queue, "effect", "renewal_rejected")

    result = manager.run_once()

    assert manager.statements == 1
    assert (result.sent, result.renewed, result.lost, result.error) == (1, 0, {"renewal_rejected": 1}, None)
    after = job_row(conn, job_id)
    assert after == row   # not one column changed, lease_until included
    assert old.lost_reason == "renewal_rejected"
    assert check_reason(job_for(old)) == "renewal_rejected"
    assert lost_total(queue, "effect", "renewal_rejected") == lost_before + 1

    # A lost lease is not sent again, and counted once.
    again = manager.run_once()
    assert (again.sent, again.lost, manager.statements) == (0, {}, 1)
    assert lost_total(queue, "effect", "renewal_rejected") == lost_before + 1


def test_renewal_of_a_cancelled_job_marks_the_lease_cancelled(dsn, conn, managers):
    queue = "hb-cancelled"
    job_id, lease = claim_one(conn, "owner", queue=queue)
    assert [r[0] for r in conn.execute(q("cancel_ids"), {"ids": [job_id]})] == [job_id]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["lease_until"]) == ("cancelled", 1, None)
    manager = managers(dsn, default_lease=30.0)
    manager.track(lease)
    lost_before = lost_total(queue, "effect", "cancelled")

    result = manager.run_once()

    assert (result.sent, result.renewed, result.lost, result.error) == (1, 0, {"cancelled": 1}, None)
    assert job_row(conn, job_id) == row
    assert lease.lost_reason == "cancelled"
    assert check_reason(job_for(lease)) == "cancelled"
    assert lost_total(queue, "effect", "cancelled") == lost_before + 1


def test_a_job_its_attempt_completed_during_the_round_loses_no_lease(dsn, conn, managers):
    """A worker completes its job between the round reading the leases and
    the renewal statement (the round still holds the lease): the renewal
    matches no row, and the lease simply ended; nothing is counted lost."""
    from pgfence.observe.metrics import LOST_REASONS

    queue = "hb-completed"
    job_id, lease = claim_one(conn, "owner", queue=queue)
    assert conn.execute(q("complete"), {"id": job_id, "attempt": lease.attempt, "result": None}).fetchall() == [(job_id,)]
    manager = managers(dsn, default_lease=30.0)
    manager.track(lease)
    before = {reason: lost_total(queue, "effect", reason) for reason in LOST_REASONS}

    result = manager.run_once()

    assert (result.sent, result.renewed, result.lost, result.error) == (1, 0, {}, None)
    assert lease.lost_reason is None
    assert {reason: lost_total(queue, "effect", reason) for reason in LOST_REASONS} == before
    assert job_row(conn, job_id)["status"] == "done"


def test_one_round_reports_each_job_of_the_batch(dsn, conn, managers):
    """Held, reclaimed, cancelled and completed jobs renewed in one statement:
    only the held one is renewed; the reclaimed and cancelled ones are lost
    for their own reasons, and the one its own attempt completed simply
    ended (no loss, no longer renewed)."""
    queue = "hb-mixed"
    held_id, held = claim_one(conn, "w1", queue=queue)
    reclaimed_id, reclaimed = claim_one(conn, "w1", queue=queue)
    cancelled_id, cancelled = claim_one(conn, "w1", queue=queue)
    done_id, done = claim_one(conn, "w1", queue=queue)
    expire(conn, reclaimed_id)
    assert claim(conn, "w2", queue=queue) == [(reclaimed_id, 2, "running")]
    conn.execute(q("cancel_ids"), {"ids": [cancelled_id]})
    assert conn.execute(q("complete"), {"id": done_id, "attempt": 1, "result": None}).fetchone() == (done_id,)
    rows_before = {i: job_row(conn, i) for i in (held_id, reclaimed_id, cancelled_id, done_id)}
    manager = managers(dsn, default_lease=30.0)
    for lease in (held, reclaimed, cancelled, done):
        manager.track(lease)
    before = {r: lost_total(queue, "effect", r) for r in ("renewal_rejected", "cancelled")}

    result = manager.run_once()

    assert manager.statements == 1
    assert (result.sent, result.renewed, result.error) == (4, 1, None)
    assert result.lost == {"renewal_rejected": 1, "cancelled": 1}
    assert (held.lost_reason, reclaimed.lost_reason, cancelled.lost_reason, done.lost_reason) == (
        None, "renewal_rejected", "cancelled", None)
    assert done not in manager.tracked()
    assert lease_until(conn, held_id) > rows_before[held_id]["lease_until"]
    for job_id in (reclaimed_id, cancelled_id, done_id):
        assert job_row(conn, job_id) == rows_before[job_id]
    assert lost_total(queue, "effect", "renewal_rejected") == before["renewal_rejected"] + 1
    assert lost_total(queue, "effect", "cancelled") == before["cancelled"] + 1
    assert check_reason(job_for(held)) is None

    second = manager.run_once()
    assert (second.sent, second.renewed, second.lost, manager.statements) == (1, 1, {}, 2)


def test_stale_and_current_attempt_of_one_job_in_one_round(dsn, conn, managers):
    """The answer is per (id, attempt): the current owner's renewal succeeding
    in the same statement must not pass for the stale attempt's."""
    queue = "hb-same-id"
    job_id, stale = claim_one(conn, "old-owner", queue=queue)
    expire(conn, job_id)
    sent_at = time.monotonic()
    assert claim(conn, "new-owner", queue=queue) == [(job_id, 2, "running")]
    current = Lease(job_id, 2, 30.0, queue, "effect", deadline=sent_at + 30.0)
    until = lease_until(conn, job_id)
    manager = managers(dsn, default_lease=30.0)
    manager.track(stale)
    manager.track(current)

    result = manager.run_once()

    assert (result.sent, result.renewed, result.lost, result.error) == (2, 1, {"renewal_rejected": 1}, None)
    assert (stale.lost_reason, current.lost_reason) == ("renewal_rejected", None)
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("running", 2, "new-owner")
    assert row["lease_until"] > until


# -- the local deadline ---------------------------------------------------------


def test_deadline_counts_from_when_the_renewal_was_sent(dsn, conn, managers):
    queue = "hb-sendtime"
    job_id, lease = claim_one(conn, "owner", queue=queue, lease=20.0)
    manager = managers(dsn, default_lease=20.0, interval=5.0)   # statement_timeout 5 s
    manager.track(lease)

    t0 = time.monotonic()
    assert manager.run_once().renewed == 1
    t1 = time.monotonic()
    assert t0 + 20.0 <= lease.deadline <= t1 + 20.0

    # Hold the job's row so the next renewal waits for it; the answer comes
    # only after the test has seen the statement waiting.
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT 1 FROM pgfence.jobs WHERE id = %s FOR UPDATE", (job_id,))
        results = []
        t_sent = time.monotonic()
        runner = threading.Thread(target=lambda: results.append(manager.run_once()))
        runner.start()
        try:
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                          " AND application_name = %s AND wait_event_type = 'Lock'",
                                    (HEARTBEAT_APP,)) == 1,
                     timeout=4, message="renewal waiting on the row lock")
            t_seen = time.monotonic()
        finally:
            locker.commit()
            runner.join(10)
    assert not runner.is_alive()
    assert [(r.sent, r.renewed, r.error) for r in results] == [(1, 1, None)]
    # Counted from the send: no later than the moment it was seen waiting,
    # though the answer arrived after that.
    assert t_sent + 20.0 <= lease.deadline <= t_seen + 20.0


def test_renewal_that_times_out_keeps_the_old_deadline(dsn, conn, managers):
    queue = "hb-slow"
    job_id, lease = claim_one(conn, "owner", queue=queue, lease=20.0)
    manager = managers(dsn, default_lease=20.0, interval=0.3)   # statement_timeout 300 ms
    manager.track(lease)
    assert manager.run_once().renewed == 1
    deadline, until = lease.deadline, lease_until(conn, job_id)
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT 1 FROM pgfence.jobs WHERE id = %s FOR UPDATE", (job_id,))
        result = manager.run_once()
        locker.rollback()
    assert (result.sent, result.renewed, result.lost) == (1, 0, {})
    assert result.error is not None and "statement timeout" in result.error
    assert lease.deadline == deadline and lease.lost_reason is None
    assert lease_until(conn, job_id) == until
    assert manager.statements == 2


def test_job_past_its_timeout_is_not_renewed(dsn, conn, managers):
    queue = "hb-timeout"
    late_id, late = claim_one(conn, "owner", queue=queue)
    live_id, live = claim_one(conn, "owner", queue=queue)
    late.timeout = 0.5
    late.started_at = time.monotonic() - 0.5     # the handler started half a second ago
    live.timeout = 3600.0
    live.started_at = time.monotonic()
    until = {i: lease_until(conn, i) for i in (late_id, live_id)}
    manager = managers(dsn, default_lease=30.0)
    manager.track(late)
    manager.track(live)
    before = lost_total(queue, "effect", "timeout")

    result = manager.run_once()

    assert (result.sent, result.renewed, result.lost, result.error) == (1, 1, {"timeout": 1}, None)
    assert manager.statements == 1
    assert late.lost_reason == "timeout" and live.lost_reason is None
    assert check_reason(job_for(late)) == "timeout"
    assert lease_until(conn, late_id) == until[late_id]
    assert lease_until(conn, live_id) > until[live_id]
    assert lost_total(queue, "effect", "timeout") == before + 1

    # Only a timed-out lease left: no statement at all.
    manager.untrack(live)
    again = manager.run_once()
    assert (again.sent, again.lost, manager.statements) == (0, {}, 1)
    assert lease_until(conn, late_id) == until[late_id]


def test_job_reaching_its_timeout_under_a_running_heartbeat(dsn, conn, managers):
    queue = "hb-timeout-live"
    job_id, lease = claim_one(conn, "owner", queue=queue, lease=3.0)
    lease.timeout = 0.6
    lease.started_at = time.monotonic()
    manager = managers(dsn, default_lease=3.0, interval=0.1)
    manager.track(lease)
    job = job_for(lease)
    manager.start()
    wait_for(lambda: lease.lost_reason is not None, timeout=5, message="lease lost")
    assert lease.lost_reason == "timeout"
    assert time.monotonic() - lease.started_at >= 0.6
    assert check_reason(job) == "timeout"
    # No renewal after the mark: one more round leaves the row alone.
    until = lease_until(conn, job_id)
    statements = manager.statements
    manager.stop()
    result = manager.run_once()
    assert (result.sent, manager.statements) == (0, statements)
    assert lease_until(conn, job_id) == until


# -- a database that cannot be reached ------------------------------------------


def test_a_heartbeat_connection_killed_while_idle_costs_no_round(dsn, conn, managers):
    """The pool's connection ended between two rounds (pg_terminate_backend,
    an idle timeout): the next round finds it dead before sending anything,
    takes a new one and renews."""
    queue = "hb-killed"
    job_id, lease = claim_one(conn, "owner", queue=queue, lease=10.0)
    manager = managers(dsn, default_lease=10.0, interval=1.0)
    manager.track(lease)
    assert manager.run_once().renewed == 1
    until = lease_until(conn, job_id)
    killed = heartbeat_backends(conn)

    terminate_heartbeat(conn)
    t0 = time.monotonic()
    renewed = manager.run_once()
    assert (renewed.sent, renewed.renewed, renewed.lost, renewed.error) == (1, 1, {}, None)
    assert lease.deadline >= t0 + 10.0
    assert lease.lost_reason is None
    assert lease_until(conn, job_id) > until
    assert heartbeat_backends(conn) not in ([], killed)


def _assert_given_up_in_time(leases_jobs, cut_at: float, length: float, queue: str, kind: str, before: float):
    """The first lease is observed through the manager's own mark, the second
    through job.check(): both no later than the deadline of the last
    successful renewal, which was sent before the cut."""
    (watched, _), (checked, checked_job) = leases_jobs
    marked_at = wait_marked(watched, timeout=length + 5)
    raised_at, reason = wait_check_raises(checked_job, timeout=length + 5)
    assert watched.lost_reason == "renewal_failed"
    assert reason == "renewal_failed"
    for lease, seen in ((watched, marked_at), (checked, raised_at)):
        assert lease.deadline <= cut_at + length          # last success sent before the cut
        assert lease.deadline <= seen <= lease.deadline + POLL_SLACK, (seen - lease.deadline)
    assert lost_total(queue, kind, "renewal_failed") == before + 2


def test_database_refusing_connections_loses_leases_by_their_deadline(dsn, conn, managers):
    """The heartbeat's backend is killed and the database stops accepting
    connections: no renewal can succeed from then on."""
    queue = "hb-refused"
    length = 1.5
    a_id, a = claim_one(conn, "owner", queue=queue, lease=length)
    b_id, b = claim_one(conn, "owner", queue=queue, lease=length)
    manager = managers(dsn, default_lease=length)
    manager.track(a)
    manager.track(b)
    until = lease_until(conn, a_id)
    before = lost_total(queue, "effect", "renewal_failed")
    dbname = scalar(conn, "SELECT current_database()")
    # A database cannot refuse connections to itself from its own session.
    with psycopg.connect(with_dbname(dsn, "postgres"), autocommit=True) as admin:
        manager.start()
        try:
            wait_for(lambda: lease_until(conn, a_id) > until, timeout=5, message="a renewal by the running heartbeat")
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
            terminate_heartbeat(conn)
            cut_at = time.monotonic()
            _assert_given_up_in_time([(a, None), (b, job_for(b))], cut_at, length, queue, "effect", before)
            assert heartbeat_backends(conn) == []
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')


class FreezableProxy:
    """A TCP proxy to the test database that can stop carrying bytes while
    keeping every connection open: a network partition where nothing fails,
    statements just never get an answer."""

    def __init__(self, dsn: str):
        params = conninfo_to_dict(dsn)
        host, port = params.get("host") or "/tmp", int(params.get("port") or 5432)
        if host.startswith("/"):
            self._family, self._address = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
        else:
            self._family, self._address = socket.AF_INET, (host, port)
        params.update(host="127.0.0.1", port=None)
        self._params = params
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def dsn(self) -> str:
        return make_conninfo("", **{**self._params, "port": self.port})

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(self._family, socket.SOCK_STREAM)
            upstream.connect(self._address)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.frozen.is_set() and not self._closed.is_set():
                    self._closed.wait(0.01)
                if self._closed.is_set():
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def test_partitioned_database_loses_leases_by_their_deadline(dsn, conn, managers):
    """The network stops carrying packets while connections stay open: the
    renewal statement hangs without an error, yet the leases are given up at
    their deadlines."""
    queue = "hb-partition"
    length = 1.5
    a_id, a = claim_one(conn, "owner", queue=queue, lease=length)
    _b_id, b = claim_one(conn, "owner", queue=queue, lease=length)
    proxy = FreezableProxy(dsn)
    manager = managers(proxy.dsn, default_lease=length)
    manager.track(a)
    manager.track(b)
    until = lease_until(conn, a_id)
    before = lost_total(queue, "effect", "renewal_failed")
    try:
        manager.start()
        wait_for(lambda: lease_until(conn, a_id) > until, timeout=5, message="a renewal through the proxy")
        proxy.frozen.set()
        cut_at = time.monotonic()
        frozen_until = lease_until(conn, a_id)
        _assert_given_up_in_time([(a, None), (b, job_for(b))], cut_at, length, queue, "effect", before)
        assert lease_until(conn, a_id) == frozen_until
    finally:
        proxy.close()


@pytest.mark.parametrize("listener", ["refused", "silent"])
def test_unreachable_dsn_loses_the_lease_by_its_deadline(listener, managers):
    """Nothing listens on the port (refused), or something accepts TCP and
    never answers (silent): no renewal is ever accepted."""
    queue, kind, length = f"hb-unreachable-{listener}", "effect", 1.0
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if listener == "refused":
        server.close()
    try:
        manager = managers(f"postgresql://postgres@127.0.0.1:{port}/pgfence", default_lease=length)
        now = time.monotonic()
        watched = Lease(1, 1, length, queue, kind, deadline=now + length)
        checked = Lease(2, 1, length, queue, kind, deadline=now + length)
        manager.track(watched)
        manager.track(checked)
        before = lost_total(queue, kind, "renewal_failed")
        manager.start()
        _assert_given_up_in_time([(watched, None), (checked, job_for(checked))], now, length, queue, kind, before)
        assert manager.statements == 0   # never got a connection to send one on
    finally:
        server.close()


def test_a_deadline_passing_while_a_renewal_waits_for_its_answer_is_renewal_failed(managers):
    """The round was sent and no answer has come (a database that accepts TCP
    and never speaks): whoever notices the deadline first, the heartbeat's
    watcher or the holder's own check(), must call it renewal_failed.  The
    reason used to be decided by a race: a check() a few milliseconds before
    the watcher said "expired" (CI failed on it once)."""
    # A 6 s lease: an interval of 2 s, so the stop at the end waits out a
    # connection timeout of 2 s, not 10.
    queue, kind, length = "hb-in-flight", "effect", 6.0
    server = socket.create_server(("127.0.0.1", 0))
    try:
        manager = managers(f"postgresql://postgres@127.0.0.1:{server.getsockname()[1]}/pgfence",
                           default_lease=length)
        lease = Lease(1, 1, length, queue, kind, deadline=time.monotonic() + length)
        manager.track(lease)
        assert lease.expiry_reason() == "expired"      # nothing sent yet
        manager.start()
        # The round waits for a connection that never completes; the lease
        # stays held (its deadline is 6 s away) and its reason is settled.
        wait_for(lambda: lease.failing, timeout=5, message="the round in flight marks its leases")
        assert lease.lost_reason is None
        assert lease.expiry_reason() == "renewal_failed"
    finally:
        server.close()


def test_renewal_looks_leases_up_by_primary_key_even_with_stale_statistics(conn):
    """Right after a bulk enqueue the statistics say no job is running; the
    renewal must still find its leases through the primary key, not by
    reading the whole table each round."""
    conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, 30000)")
    conn.execute("ANALYZE pgfence.jobs")          # every row queued, as far as the planner knows
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": 500, "worker": "stale", "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}).fetchall()
    params = {"ids": [r[0] for r in rows], "attempts": [r[5] for r in rows], "leases": [30.0] * len(rows)}

    def plan(settings: bool) -> list[str]:
        with conn.transaction(force_rollback=True):
            if settings:
                conn.execute(q("renewal_settings"), {"ms": "5000", "idle_ms": "60000"})
            text = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + q("renew"), params)]
        return [line.strip() for line in text]

    # Before migration 0005 the plan without the settings read the whole
    # table (a Seq Scan on jobs); jobs_running_idx now gives the planner a
    # small way in even then.  The settings stay, as the guarantee.
    for settings in (False, True):
        lines = plan(settings)
        assert not any("Seq Scan on jobs" in line for line in lines), lines
        assert any("Index Scan using jobs_pkey on jobs" in line or "jobs_running_idx" in line
                   for line in lines), lines
    # And the renewal itself renews all 500.
    with conn.transaction():
        conn.execute(q("renewal_settings"), {"ms": "5000", "idle_ms": "60000"})
        assert len(conn.execute(q("renew"), params).fetchall()) == 500


def test_renewals_are_hot_updates(conn):
    """pgfence.jobs keeps a fifth of each page free (migration 0003), and a
    renewal changes no indexed column, so it is written into the same page (a
    HOT update) and adds no index entries whenever the page has room.

    The test counts only what the renewal decides.  It used to demand that
    rounds 7 and 8 of 200 renewals be all HOT, which needs the old row
    versions of each round pruned, and pruning waits for every snapshot that
    may still see them: this session's own snapshots reach back to the
    oldest transaction still running anywhere in the cluster (another test's,
    a benchmark's), and an autovacuum ANALYZE of the table holds one too.  So
    here the renewed rows sit in a page with room for all their versions, no
    pruning needed, and each renewal must be HOT; and no index may cover the
    renewed column, by key, expression or predicate."""
    assert "fillfactor=80" in scalar(conn, "SELECT reloptions FROM pg_class WHERE oid = 'pgfence.jobs'::regclass")
    blocking = conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i"
        "  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname = 'lease_until'"
        " WHERE i.indrelid = 'pgfence.jobs'::regclass"
        "   AND (a.attnum = ANY(i.indkey) OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%%lease_until%%'"
        "        OR pg_get_expr(i.indpred, i.indrelid) LIKE '%%lease_until%%')").fetchall()
    assert blocking == []

    conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, 3)")
    rows = conn.execute(q("claim"), {"queues": ["default"], "batch": 3, "worker": "hot", "lease": 30.0,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}).fetchall()
    params = {"ids": [r[0] for r in rows], "attempts": [r[5] for r in rows], "leases": [30.0] * 3}
    # Every version of the three rows fits in their one page, with room to
    # spare: no renewal needs pruning to stay in the page.
    pages = "SELECT count(DISTINCT (ctid::text::point)[0]) FROM pgfence.jobs"
    assert scalar(conn, pages) == 1
    size = scalar(conn, "SELECT max(pg_column_size(j.*)) FROM pgfence.jobs j")
    assert 3 * (2 + 8) * (size + 28) < 8192 * 0.8, size   # versions: enqueue, claim, 8 renewals
    counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = 'pgfence.jobs'::regclass"

    def renew() -> tuple[int, int]:
        """One round; this backend's own update counts for it (pg_stat_xact
        sees only this transaction, whatever other sessions do)."""
        with conn.transaction():
            conn.execute(q("renewal_settings"), {"ms": "5000", "idle_ms": "60000"})
            before = conn.execute(counts).fetchone()
            assert len(conn.execute(q("renew"), params).fetchall()) == 3
            after = conn.execute(counts).fetchone()
        return after[0] - before[0], after[1] - before[1]

    assert [renew() for _ in range(8)] == [(3, 3)] * 8
    assert scalar(conn, pages) == 1


def test_number_arrays_go_as_one_literal_the_sql_casts(conn):
    from pgfence.store.db import array_literal

    assert array_literal([1, 42, 9_000_000_000]) == "{1,42,9000000000}"
    assert array_literal(float(x) for x in (30, 0.25)) == "{30.0,0.25}"
    assert array_literal([]) == "{}"
    row = conn.execute("SELECT %(i)s::bigint[], %(f)s::float8[], %(e)s::int[]",
                       {"i": array_literal([1, 9_000_000_000]), "f": array_literal([0.25, 1e-05]),
                        "e": array_literal([])}).fetchone()
    assert row == ([1, 9_000_000_000], [0.25, 1e-05], [])


# -- renewals follow each lease --------------------------------------------------


def test_renew_period_follows_each_lease_and_the_configured_heartbeat():
    from pgfence.renewal.renewer import renew_period

    assert renew_period(30.0, None) == 10.0
    assert renew_period(1.5, None) == 0.5
    assert renew_period(30.0, 2.0) == 2.0       # configured, shorter than the lease: kept
    assert renew_period(1.5, 2.0) == 0.5        # a lease the heartbeat cannot keep: a third of it


def test_heartbeat_longer_than_half_a_kind_lease_is_refused():
    from pgfence.errors import ConfigError
    from pgfence.renewal.renewer import validate_heartbeat
    from pgfence.registry import HandlerSpec

    specs = [HandlerSpec("long", print, lease=60.0), HandlerSpec("short", print, lease=6.0),
             HandlerSpec("default", print)]
    validate_heartbeat(None, specs)
    validate_heartbeat(3.0, specs)
    with pytest.raises(ConfigError) as info:
        validate_heartbeat(3.5, specs)
    assert str(info.value) == ("invalid heartbeat: 3.5s cannot keep the 6s lease of kind 'short'; give at most "
                               "half of it (3s), or leave heartbeat unset to renew each lease when a third of it "
                               "has passed")


def test_a_lease_run_out_with_no_failed_renewal_is_expired_not_renewal_failed():
    now = time.monotonic()
    unrenewed = Lease(1, 1, 1.0, "q", "k", deadline=now - 0.01)
    assert unrenewed.lost() == "expired"
    failing = Lease(2, 1, 1.0, "q", "k", deadline=now - 0.01, failing=True)
    assert failing.lost() == "renewal_failed"
    # A success clears it.
    renewed = Lease(3, 1, 1.0, "q", "k", deadline=now + 0.5, failing=True)
    renewed.renewed(now)
    assert (renewed.failing, renewed.deadline) == (False, now + 1.0)


def test_a_round_marks_a_lease_nobody_renewed_in_time_expired(dsn, conn, managers):
    """(A lease whose renewals failed is renewal_failed: see the tests of an
    unreachable database below.)"""
    queue = "hb-expired"
    _id, stale = claim_one(conn, "owner", queue=queue, lease=0.2)
    manager = managers(dsn, default_lease=30.0)
    manager.track(stale)
    wait_for(lambda: stale.expired(), timeout=5, message="the deadline passed")
    before = lost_total(queue, "effect", "expired")
    result = manager.run_once()
    assert (result.sent, result.lost, stale.lost_reason) == (0, {"expired": 1}, "expired")
    assert lost_total(queue, "effect", "expired") == before + 1


def test_in_process_worker_renews_a_kind_lease_shorter_than_the_interval(dsn, conn, make_worker):
    """`pgfence work` with the default 30 s lease (10 s interval) and a kind
    with lease=1.5 whose handler works 4.5 s, checking its lease: renewed at
    its own pace, done on attempt 1, no lease lost."""
    from pgfence import handler
    from pgfence.observe.metrics import LOST_REASONS

    kind = "hb_short_lease"

    @handler(kind, lease=1.5)
    def work(job):
        deadline = time.monotonic() + 4.5
        while time.monotonic() < deadline:
            job.check()
            time.sleep(0.02)

    job_id = enqueue(conn, kind, {})
    before = {reason: lost_total("default", kind, reason) for reason in LOST_REASONS}
    worker = make_worker(lease=30.0)
    stats = worker.run(burst=True)
    assert stats.outcomes == {"done": 1}
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"]) == ("done", 1, 0)
    assert {reason: lost_total("default", kind, reason) for reason in LOST_REASONS} == before
    assert worker.heartbeat.statements >= 6     # at least every 0.5 s over 4.5 s


def test_in_process_timeout_is_told_at_once_and_the_job_held_through_the_grace(dsn, conn, managers):
    """Past its timeout a lease is marked lost (timeout) at once by the
    running thread, and still renewed until timeout + grace, then no more."""
    queue = "hb-timeout-grace"
    job_id, lease = claim_one(conn, "owner", queue=queue, lease=1.5)
    lease.timeout = 0.5
    lease.started_at = time.monotonic()
    manager = managers(dsn, default_lease=30.0, timeout_grace=1.5)
    manager.track(lease)
    manager.start()
    marked = wait_marked(lease, timeout=5)
    assert lease.lost_reason == "timeout"
    assert marked - lease.started_at < 0.5 + POLL_SLACK
    # Held: renewed past the end of the first lease, through the grace.
    first = lease_until(conn, job_id)
    wait_for(lambda: lease_until(conn, job_id) > first, timeout=3, message="a renewal after the timeout")
    wait_for(lambda: time.monotonic() > lease.started_at + 0.5 + 1.5, timeout=5, message="the grace over")
    statements = manager.statements
    last = lease_until(conn, job_id)
    result = manager.run_once()
    assert (result.sent, manager.statements, lease_until(conn, job_id)) == (0, statements, last)


def test_after_a_failed_round_the_next_waits_one_period_even_for_a_lease_due_in_the_past(managers):
    """A lease due now whose round failed must not make the loops retry at
    once, over and over: the next round comes one period later."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()   # nothing listens there: every connection is refused
    manager = managers(f"postgresql://postgres@127.0.0.1:{port}/postgres", default_lease=30.0, interval=1.0)
    lease = Lease(1, 1, 30.0, "q", "k", deadline=time.monotonic() + 28.0)   # due 1 s ago
    manager.track(lease)
    started = time.monotonic()
    result = manager.run_once()
    assert result.error is not None and lease.failing and lease.lost_reason is None
    assert manager.next_round([lease], time.monotonic()) >= started + 1.0
