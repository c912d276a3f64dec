"""The fence against real PostgreSQL and real worker processes.

Every write that depends on owning a job carries ``(id, attempt)``; a claim
bumps the attempt.  These tests reproduce the double run the fence exists
for (two unprotected workers, a job longer than its lease), then show it
gone: with renewal and the fence, under SIGSTOP, in the exact race between a
reclaim and a stale completion, and when a worker's connection is killed in
the middle of a job.

This module also defines the ``fence_probe`` handler; the worker processes
of some tests register it from a module written to the test's tmp folder, so
the test process's own registry never holds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import psycopg
from psycopg.types.json import Json
import pytest
from prometheus_client import REGISTRY

from pgtools import env_for, job_row, scalar, spawn, wait_for
from pgfence import Job, LeaseLost, PgfenceError, enqueue, handler
from pgfence.worker.lease import Lease
from pgfence.handlers.tables import INSERT_EFFECT
from pgfence.store.queries import q
from pgfence.settings import Settings
from pgfence.worker.engine import Worker
from pgfence.worker.outcomes import LOST

#: Lease of the worker processes, and the length of a "long" job: the job
#: outlives the lease by far, as in the seed's double run (3 s and 10 s).
LEASE = 1.5
LONG_JOB = 4.0
#: The module the worker processes import to register fence_probe.
PROBE_MODULE = "pgfence_test_probe"
PROBE_SOURCE = """\
from pgfence import handler
from test_fence import fence_probe

handler("fence_probe")(fence_probe)
"""


def fence_probe(job: Job) -> None:
    """Writes its effect first, then works ``payload.seconds`` inside the
    still open fenced transaction without looking at its lease: only the
    fence can keep a stale attempt's write out."""
    seconds = float(job.payload.get("seconds", 0))
    with job.fenced() as conn:
        conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                     "key": job.idempotency_key, "worker": str(os.getpid())})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:    # simulated work
            time.sleep(0.01)


# -- helpers ------------------------------------------------------------------


class Workers:
    """``pgfence work`` processes, their logs in files; all cleaned up."""

    def __init__(self, dsn: str, tmp_path):
        self.dsn = dsn
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, probe: bool = False,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``pgfence work --name NAME``; with ``probe`` the worker
        knows the builtin handlers and fence_probe."""
        environ = env_for(self.dsn, **(env or {}))
        if probe:
            (self.tmp_path / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
            environ["PYTHONPATH"] = os.pathsep.join([str(self.tmp_path), environ["PYTHONPATH"]])
            args += ("--handlers", f"pgfence.handlers.builtin,{PROBE_MODULE}")
        log = open(self.tmp_path / f"{name}.log", "w")
        try:
            proc = spawn("work", "--name", name, "--lease", str(LEASE), "--poll-interval", "0.1", *args,
                         env=environ, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def wait(self, name: str, timeout: float = 20) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {name} still running after {timeout}s:\n{self.log(name)}") from None

    def stop(self, name: str) -> int:
        self.procs[name].send_signal(signal.SIGTERM)
        return self.wait(name)

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)   # a stopped process dies only once resumed
                proc.kill()
                proc.wait(10)


@pytest.fixture
def workers(dsn, tmp_path):
    pool = Workers(dsn, tmp_path)
    try:
        yield pool
    finally:
        pool.cleanup()


def owner(conn, job_id: int) -> tuple[int, str] | None:
    """(attempt, locked_by) while the job runs, else None."""
    row = job_row(conn, job_id)
    return (row["attempt"], row["locked_by"]) if row["status"] == "running" else None


def status(conn, job_id: int) -> str:
    return job_row(conn, job_id)["status"]


def effects(conn) -> list[tuple[int, int, str]]:
    return [tuple(r) for r in conn.execute("SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY id")]


def backend(conn, app: str) -> tuple[int, str, str | None] | None:
    """(pid, state, wait_event_type) of the one session of this database
    named ``app``, or None."""
    rows = conn.execute("SELECT pid, state, wait_event_type FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name = %s", (app,)).fetchall()
    assert len(rows) <= 1, rows
    return tuple(rows[0]) if rows else None


def worker_app(name: str) -> str:
    return f"pgfence worker {name}"


def terminate(conn, app: str) -> None:
    pid = backend(conn, app)[0]
    assert scalar(conn, "SELECT pg_terminate_backend(%s)", (pid,)) is True
    wait_for(lambda: (backend(conn, app) or (None,))[0] != pid, timeout=10, message=f"{app} backend gone")


def claim(conn, worker: str, *, queue: str = "default", lease: float = 30.0) -> list[tuple[int, int, str]]:
    """The real claim query: (id, attempt, prev_status) per claimed job."""
    rows = conn.execute(q("claim"), {"queues": [queue], "batch": 1, "worker": worker, "lease": lease,
                                     "lease_kinds": [], "lease_secs": [], "reclaim": True, "kinds": None, "not_kinds": None}).fetchall()
    return [(r[0], r[5], r[14]) for r in rows]


def expire(conn, job_id: int) -> None:
    conn.execute("UPDATE pgfence.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def insert_effect(conn, job: Job) -> None:
    conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                 "key": job.idempotency_key, "worker": f"attempt-{job.attempt}"})


def both_connected(conn, names) -> bool:
    return all(backend(conn, worker_app(n)) is not None for n in names)


# -- 1. the seed's double run, and the same run protected ------------------------


def test_unprotected_workers_run_a_long_job_twice(dsn, conn, workers):
    """No renewal and completion by id: the job outlives its lease, the
    second worker reclaims it, both write their effect, the job ends done."""
    procs = {n: workers.start(n, "--max-jobs", "1", "--unprotected") for n in ("A", "B")}
    wait_for(lambda: both_connected(conn, procs), timeout=20, message="both workers polling")
    job_id = enqueue(conn, "effect", {"seconds": LONG_JOB})

    first = wait_for(lambda: owner(conn, job_id), timeout=10, message="the first claim")
    assert first[0] == 1
    rival = "B" if first[1] == "A" else "A"
    wait_for(lambda: owner(conn, job_id) == (2, rival), timeout=10, message="the reclaim by the other worker")

    assert workers.wait("A") == 0 and workers.wait("B") == 0
    assert effects(conn) == [(job_id, 1, str(procs[first[1]].pid)), (job_id, 2, str(procs[rival].pid))]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("done", 2, 1, None)


def test_protected_workers_run_a_long_job_once(dsn, conn, workers):
    """The same two workers and job with renewal and the fence: the lease is
    renewed while the job runs, the other worker never gets it."""
    procs = {n: workers.start(n) for n in ("A", "B")}
    wait_for(lambda: both_connected(conn, procs), timeout=20, message="both workers polling")
    job_id = enqueue(conn, "effect", {"seconds": LONG_JOB})

    first = wait_for(lambda: owner(conn, job_id), timeout=10, message="the claim")
    claimed_at = time.monotonic()
    assert first[0] == 1
    first_until = job_row(conn, job_id)["lease_until"]
    wait_for(lambda: job_row(conn, job_id)["lease_until"] > first_until, timeout=LEASE,
             message="a renewal before the first lease ran out")
    wait_for(lambda: status(conn, job_id) == "done", timeout=LONG_JOB + 10, message="the job done")
    # The rival polled every 0.1 s for longer than a lease while the job ran.
    assert time.monotonic() - claimed_at > LEASE + 1

    assert effects(conn) == [(job_id, 1, str(procs[first[1]].pid))]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("done", 1, 0, None)
    assert workers.stop("A") == 0 and workers.stop("B") == 0
    assert "lost its lease" not in workers.log("A") + workers.log("B")


# -- 2. a worker stopped past its lease ---------------------------------------


def test_sigstopped_worker_loses_its_job_to_the_reclaim(dsn, conn, workers):
    """A is stopped mid-job; B reclaims the job as attempt 2 and completes
    it; A, resumed, learns its lease is gone and writes nothing."""
    workers.start("A", "--max-jobs", "1")
    job_id = enqueue(conn, "effect", {"seconds": 1.5})
    wait_for(lambda: owner(conn, job_id) == (1, "A"), timeout=20, message="A's claim")
    a = workers.procs["A"]
    os.kill(a.pid, signal.SIGSTOP)
    b = workers.start("B", "--max-jobs", "1")
    wait_for(lambda: owner(conn, job_id) == (2, "B"), timeout=20, message="B's reclaim")
    wait_for(lambda: status(conn, job_id) == "done", timeout=10, message="B's completion")
    done = job_row(conn, job_id)
    assert (done["status"], done["attempt"], done["reclaims"], done["locked_by"]) == ("done", 2, 1, None)
    assert workers.wait("B") == 0

    os.kill(a.pid, signal.SIGCONT)
    assert workers.wait("A") == 0
    assert effects(conn) == [(job_id, 2, str(b.pid))]
    assert job_row(conn, job_id) == done
    assert f"job {job_id} attempt 1 lost its lease" in workers.log("A")


def test_sigstopped_worker_inside_its_fenced_transaction_is_rolled_back(dsn, conn, workers):
    """A has written its effect in its open fenced transaction when it is
    stopped; B reclaims and completes; A, resumed, runs its fenced completion:
    it matches no row, and A's effect is rolled back."""
    workers.start("A", "--max-jobs", "1", probe=True)
    job_id = enqueue(conn, "fence_probe", {"seconds": 1.0})
    wait_for(lambda: (backend(conn, worker_app("A")) or (0, ""))[1] == "idle in transaction",
             timeout=20, message="A inside its fenced transaction")
    a = workers.procs["A"]
    os.kill(a.pid, signal.SIGSTOP)
    assert owner(conn, job_id) == (1, "A")
    b = workers.start("B", "--max-jobs", "1", probe=True)
    wait_for(lambda: status(conn, job_id) == "done", timeout=20, message="B's reclaim and completion")
    assert workers.wait("B") == 0
    done = job_row(conn, job_id)
    assert (done["status"], done["attempt"], done["reclaims"], done["locked_by"]) == ("done", 2, 1, None)
    assert effects(conn) == [(job_id, 2, str(b.pid))]

    os.kill(a.pid, signal.SIGCONT)
    assert workers.wait("A") == 0
    assert effects(conn) == [(job_id, 2, str(b.pid))]
    assert job_row(conn, job_id) == done
    assert backend(conn, worker_app("A")) is None
    assert f"job {job_id} attempt 1 lost its lease (fence_rejected)" in workers.log("A")


# -- 3. the race, step by step on two connections --------------------------------


@pytest.mark.parametrize("pipeline", [False, True], ids=["statements", "pipelined"])
def test_reclaim_wins_the_race_against_a_blocked_stale_completion(dsn, conn, pipeline):
    """R reclaims the expired job and holds its row uncommitted; the old
    owner's fenced completion blocks on the row lock; R commits; the
    completion then matches nothing: LeaseLost, its write rolled back."""
    queue, kind = "fence-race", "effect"
    job_id = enqueue(conn, kind, {}, queue=queue)
    assert claim(conn, "old-owner", queue=queue, lease=30.0) == [(job_id, 1, "queued")]
    expire(conn, job_id)
    prevented = sample("pgfence_double_run_prevented_total", queue=queue, kind=kind)
    lost = sample("pgfence_lease_lost_total", queue=queue, kind=kind, reason="fence_rejected")

    with psycopg.connect(dsn, autocommit=True, application_name="fence old owner") as old_conn, \
            psycopg.connect(dsn, application_name="fence reclaimer") as reclaimer:
        old = Job(job_id, kind, queue, 1, {}, Lease(job_id, 1, 30.0, queue, kind, deadline=time.monotonic() + 30),
                  conn=old_conn)
        assert claim(reclaimer, "new-owner", queue=queue) == [(job_id, 2, "running")]   # not committed

        outcome: dict[str, object] = {}

        def complete_old() -> None:
            try:
                with old.fenced(pipeline=pipeline) as c:
                    insert_effect(c, old)
                outcome["completed"] = True
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                outcome["error"] = exc

        thread = threading.Thread(target=complete_old)
        thread.start()
        try:
            wait_for(lambda: backend(conn, "fence old owner")[2] == "Lock", timeout=10,
                     message="the stale completion waiting on the row lock")
            assert owner(conn, job_id) == (1, "old-owner")      # the reclaim is not visible yet
            assert outcome == {}
        finally:
            reclaimer.commit()
            thread.join(10)
        assert not thread.is_alive()

        error = outcome.get("error")
        assert isinstance(error, LeaseLost), outcome
        assert (error.job_id, error.attempt, error.reason) == (job_id, 1, "fence_rejected")
        assert (old.completed, old.lease.lost_reason) == (False, "fence_rejected")
        assert old_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert effects(conn) == []
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["locked_by"]) == ("running", 2, "new-owner")
        assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented + 1
        assert sample("pgfence_lease_lost_total", queue=queue, kind=kind, reason="fence_rejected") == lost + 1

        # The new owner completes through the same fence.
        new = Job(job_id, kind, queue, 2, {}, Lease(job_id, 2, 30.0, queue, kind, deadline=time.monotonic() + 30),
                  conn=old_conn)
        with new.fenced(pipeline=pipeline) as c:
            insert_effect(c, new)
        assert new.completed
    assert effects(conn) == [(job_id, 2, "attempt-2")]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("done", 2, None)
    assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented + 1


def test_completion_holding_the_row_is_skipped_by_the_reclaim(dsn, conn):
    """The other order: the owner's completion has the row locked when the
    reclaim comes; the claim skips the row, the completion commits."""
    job_id = enqueue(conn, "effect", {})
    assert claim(conn, "owner") == [(job_id, 1, "queued")]
    expire(conn, job_id)
    with psycopg.connect(dsn) as owner_conn:
        assert owner_conn.execute(q("complete"), {"id": job_id, "attempt": 1, "result": None}).fetchall() == [(job_id,)]
        assert claim(conn, "reclaimer") == []              # SKIP LOCKED: no wait, no claim
        owner_conn.commit()
    assert claim(conn, "reclaimer") == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("done", 1, 0, None)


@pytest.mark.parametrize("pipeline", [False, True], ids=["statements", "pipelined"])
def test_fence_compares_the_token_not_the_clock(dsn, conn, pipeline):
    """A lease that ran out while nobody reclaimed the job: the attempt still
    owns it, and its fenced completion commits."""
    queue, kind = "fence-token", "effect"
    job_id = enqueue(conn, kind, {}, queue=queue)
    assert claim(conn, "owner", queue=queue, lease=30.0) == [(job_id, 1, "queued")]
    expire(conn, job_id)
    assert scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (job_id,)) is True
    prevented = sample("pgfence_double_run_prevented_total", queue=queue, kind=kind)
    with psycopg.connect(dsn, autocommit=True) as c:
        job = Job(job_id, kind, queue, 1, {}, Lease(job_id, 1, 30.0, queue, kind, deadline=time.monotonic() + 30),
                  conn=c)
        with job.fenced(pipeline=pipeline) as tx:
            insert_effect(tx, job)
    assert job.completed and job.lease.lost_reason is None
    assert effects(conn) == [(job_id, 1, "attempt-1")]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["locked_by"], row["lease_until"]) == ("done", 1, None, None)
    assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented
    assert claim(conn, "reclaimer", queue=queue) == []


# -- the worker's own fenced paths, in process -----------------------------------


def test_worker_counts_a_reclaim_and_rejects_the_stale_attempts_write(dsn, conn):
    """In one process: worker 1's handler is overtaken (its job reclaimed by
    worker 2) before it writes; its fenced write is rolled back, the outcome
    is 'lost', and each counter moves by exactly one."""
    queue, kind = "fence-inproc", "fence_overtaken"
    settings = Settings(queues=(queue,), lease=30.0)
    first, second = Worker(dsn, settings, name="w1"), Worker(dsn, settings, name="w2")
    reclaimed: list[Job] = []

    @handler(kind)
    def overtaken(job: Job) -> None:
        expire(conn, job.id)
        reclaimed.extend(second.claim())
        with job.fenced() as c:
            insert_effect(c, job)

    job_id = enqueue(conn, kind, {}, queue=queue)
    before = {
        "reclaims": sample("pgfence_reclaims_total", queue=queue, kind=kind),
        "prevented": sample("pgfence_double_run_prevented_total", queue=queue, kind=kind),
        "lost": sample("pgfence_lease_lost_total", queue=queue, kind=kind, reason="fence_rejected"),
        "completed": sample("pgfence_jobs_completed_total", queue=queue, kind=kind),
    }
    try:
        [job] = first.claim()
        assert (job.id, job.attempt) == (job_id, 1)
        assert first.run_job(job) == LOST
        assert [(j.id, j.attempt) for j in reclaimed] == [(job_id, 2)]
        assert (second.stats.reclaimed, first.stats.outcomes) == (1, {LOST: 1})
        assert effects(conn) == []
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
            "running", 2, 1, "w2", None)
        assert sample("pgfence_reclaims_total", queue=queue, kind=kind) == before["reclaims"] + 1
        assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == before["prevented"] + 1
        assert sample("pgfence_lease_lost_total", queue=queue, kind=kind,
                      reason="fence_rejected") == before["lost"] + 1
        assert sample("pgfence_jobs_completed_total", queue=queue, kind=kind) == before["completed"]
    finally:
        first.close()
        second.close()


def test_worker_error_report_of_a_stale_attempt_is_fenced(dsn, conn):
    """A handler that fails after its job was reclaimed: the stale error
    report matches no row and leaves the new owner's job untouched."""
    queue, kind = "fence-stale-error", "fence_fails_late"
    settings = Settings(queues=(queue,), lease=30.0)
    worker = Worker(dsn, settings, name="w1")

    @handler(kind)
    def fails_late(job: Job) -> None:
        expire(conn, job.id)
        assert claim(conn, "w2", queue=queue) == [(job.id, 2, "running")]
        raise RuntimeError("failed after losing the job")

    job_id = enqueue(conn, kind, {}, queue=queue)
    prevented = sample("pgfence_double_run_prevented_total", queue=queue, kind=kind)
    try:
        [job] = worker.claim()
        assert worker.run_job(job) == LOST
    finally:
        worker.close()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["locked_by"], row["last_error"]) == ("running", 2, "w2", None)
    assert job.lease.lost_reason == "fence_rejected"
    assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented + 1


# -- 5. the worker's connection killed in the middle of a job ----------------------


@pytest.mark.parametrize("moment", ["working", "in_fenced_transaction"])
def test_worker_connection_killed_mid_job_ends_done_exactly_once(dsn, conn, workers, moment):
    """pg_terminate_backend on the worker's connection while the handler
    works (before its write), or inside its fenced transaction (after its
    write, before the completion): the attempt is reported failed on a new
    connection and retried; the job ends done with exactly one effect."""
    kind = "effect" if moment == "working" else "fence_probe"
    workers.start("W", "--max-jobs", "2", probe=True, env={"PGFENCE_BACKOFF_BASE": "0.05"})
    job_id = enqueue(conn, kind, {"seconds": 1.0})
    if moment == "working":
        wait_for(lambda: owner(conn, job_id) == (1, "W") and (backend(conn, worker_app("W")) or (0, ""))[1] == "idle",
                 timeout=20, message="W working on the job")
    else:
        wait_for(lambda: (backend(conn, worker_app("W")) or (0, ""))[1] == "idle in transaction",
                 timeout=20, message="W inside its fenced transaction")
        assert owner(conn, job_id) == (1, "W")
    terminate(conn, worker_app("W"))

    assert workers.wait("W") == 0, workers.log("W")
    w = workers.procs["W"]
    assert effects(conn) == [(job_id, 2, str(w.pid))]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"]) == ("done", 2, 0, None)
    assert row["last_error"].startswith("DatabaseUnavailable"), row["last_error"]


# -- the pipelined block: Job.fenced(pipeline=True) --------------------------------


def claimed_job(conn, job_conn, queue: str, kind: str = "effect") -> Job:
    """Enqueue and claim one job as attempt 1; the Job runs on ``job_conn``."""
    job_id = enqueue(conn, kind, {}, queue=queue)
    assert claim(conn, "owner", queue=queue) == [(job_id, 1, "queued")]
    return Job(job_id, kind, queue, 1, {}, Lease(job_id, 1, 30.0, queue, kind, deadline=time.monotonic() + 30),
               conn=job_conn)


def protocol_trace(conn, path) -> contextlib.AbstractContextManager:
    """libpq's trace of the messages ``conn`` sends and receives, into ``path``."""
    @contextlib.contextmanager
    def tracing():
        with open(path, "w") as f:
            conn.pgconn.trace(f.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                yield
            finally:
                conn.pgconn.untrace()
    return tracing()


def test_pipelined_block_commits_writes_and_completion_in_one_round_trip(dsn, conn, tmp_path):
    """BEGIN, two writes, the completion and COMMIT reach the server as one
    batch ended by a single Sync, and one ReadyForQuery comes back: one
    round trip, one transaction (the same xid on the effect rows and on the
    job)."""
    queue = "pipe-ok"
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue)
        with protocol_trace(c, trace):
            with job.fenced(pipeline=True) as tx:
                insert_effect(tx, job)
                insert_effect(tx, job)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Lines of the trace: direction (F sent, B received), length, message.
    messages = [line.split("\t")[0::2][:2] for line in trace.read_text().splitlines()
                if line[:2] in ("F\t", "B\t")]
    sent = [name for way, name in messages if way == "F"]
    first_reply = next(i for i, (way, _name) in enumerate(messages) if way == "B")
    assert all(way == "B" for way, _name in messages[first_reply:]), messages
    assert sent.count("Execute") == 5, sent           # BEGIN, 2 inserts, complete_or_raise, COMMIT
    assert sent.count("Sync") == 1, sent
    assert [name for way, name in messages if way == "B"][-1:] == ["ReadyForQuery"]
    assert [name for way, name in messages].count("ReadyForQuery") == 1
    assert job.completed and job.lease.lost_reason is None
    assert effects(conn) == [(job.id, 1, "attempt-1"), (job.id, 1, "attempt-1")]
    xids = conn.execute("SELECT DISTINCT xmin::text FROM pgfence_examples.effects").fetchall()
    assert len(xids) == 1
    # The completion moved the job to history in the block's transaction.
    assert scalar(conn, "SELECT xmin::text FROM pgfence.job_history WHERE id = %s", (job.id,)) == xids[0][0]
    row = job_row(conn, job.id)
    assert (row["status"], row["attempt"], row["locked_by"], row["lease_until"]) == ("done", 1, None, None)


def one_round_trip_block(job: Job, how: str):
    """The two blocks sent in one round trip with the raising completion."""
    return job.fenced(pipeline=True) if how == "pipelined" else job.fenced_writes()


@pytest.mark.parametrize("how", ["pipelined", "fenced_writes"])
def test_one_round_trip_block_of_a_reclaimed_attempt_is_rolled_back(dsn, conn, how):
    """Another attempt owns the job (the reclaim committed): the completion
    raises PF001 on the server, the queued COMMIT is skipped, nothing of the
    block stays, and the connection is usable again."""
    queue, kind = f"stale-{how}", "effect"
    prevented = sample("pgfence_double_run_prevented_total", queue=queue, kind=kind)
    lost = sample("pgfence_lease_lost_total", queue=queue, kind=kind, reason="fence_rejected")
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue, kind)
        expire(conn, job.id)
        assert claim(conn, "reclaimer", queue=queue) == [(job.id, 2, "running")]
        with pytest.raises(LeaseLost) as raised:
            with one_round_trip_block(job, how) as tx:
                insert_effect(tx, job)
        assert (raised.value.job_id, raised.value.attempt, raised.value.reason) == (job.id, 1, "fence_rejected")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert c.execute("SELECT 41 + 1").fetchone() == (42,)
    assert (job.completed, job.lease.lost_reason) == (False, "fence_rejected")
    assert effects(conn) == []
    row = job_row(conn, job.id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("running", 2, "reclaimer")
    assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented + 1
    assert sample("pgfence_lease_lost_total", queue=queue, kind=kind, reason="fence_rejected") == lost + 1


def test_a_pipeline_aborted_without_its_cause_is_told_apart_by_the_fence(dsn, conn):
    """psycopg may report a pipelined block's failure as a bare "pipeline
    aborted" (the completion's PF001 read elsewhere, depending on timing;
    seen under load): the block then asks the fence.  A reclaimed attempt
    gets LeaseLost, an attempt that still owns its job gets the error."""
    queue, kind = "pipe-aborted", "effect"
    with psycopg.connect(dsn, autocommit=True) as c:
        owned = claimed_job(conn, c, queue, kind)
        with pytest.raises(PgfenceError, match="pipeline aborted") as raised:
            with owned._raising_fence(c):
                raise psycopg.errors.PipelineAborted("pipeline aborted")
        assert not isinstance(raised.value, LeaseLost)
        assert (owned.completed, owned.lease.lost_reason) == (False, None)

        stale = claimed_job(conn, c, queue, kind)
        expire(conn, stale.id)
        assert claim(conn, "reclaimer", queue=queue) == [(stale.id, 2, "running")]
        with pytest.raises(LeaseLost) as lost:
            with stale._raising_fence(c):
                raise psycopg.errors.PipelineAborted("pipeline aborted")
        assert (lost.value.job_id, lost.value.attempt, lost.value.reason) == (stale.id, 1, "fence_rejected")
        assert (stale.completed, stale.lease.lost_reason) == (False, "fence_rejected")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_pipelined_block_with_a_failing_statement_keeps_nothing(dsn, conn):
    """A statement of the block fails on the server: the error is raised at
    the end of the block (as a pgfence error), the write before it and the
    completion are gone, the job still runs as attempt 1 and can complete."""
    queue, kind = "pipe-error", "effect"
    prevented = sample("pgfence_double_run_prevented_total", queue=queue, kind=kind)
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue, kind)
        with pytest.raises(PgfenceError, match="division by zero"):
            with job.fenced(pipeline=True) as tx:
                insert_effect(tx, job)
                tx.execute("SELECT 1 / 0")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert not job.completed and job.lease.lost_reason is None
        assert effects(conn) == []
        assert owner(conn, job.id) == (1, "owner")
        with job.fenced(pipeline=True) as tx:
            insert_effect(tx, job)
    assert job.completed
    assert effects(conn) == [(job.id, 1, "attempt-1")]
    assert status(conn, job.id) == "done"
    assert sample("pgfence_double_run_prevented_total", queue=queue, kind=kind) == prevented


def test_pipelined_block_rolls_back_when_the_handler_raises(dsn, conn):
    queue = "pipe-raise"
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue)
        with pytest.raises(ValueError, match="card declined"):
            with job.fenced(pipeline=True) as tx:
                insert_effect(tx, job)
                raise ValueError("card declined")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not job.completed
    assert effects(conn) == []
    assert owner(conn, job.id) == (1, "owner")


def test_pipelined_block_keeps_savepoints_and_forbids_an_early_commit(dsn, conn):
    """A nested transaction() is a savepoint whose error can be caught (the
    block goes on); conn.commit() inside the block raises instead of
    committing the writes without the fence."""
    queue = "pipe-nested"
    conn.execute("CREATE TABLE pipe_once (k text PRIMARY KEY)")
    conn.execute("INSERT INTO pipe_once VALUES ('taken')")
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue)
        with job.fenced(pipeline=True) as tx:
            insert_effect(tx, job)
            with pytest.raises(psycopg.errors.UniqueViolation):
                with tx.transaction():
                    tx.execute("INSERT INTO pipe_once VALUES ('taken')")
            tx.execute("INSERT INTO pipe_once VALUES ('mine')")
        assert job.completed

        other = claimed_job(conn, c, queue)
        with pytest.raises(PgfenceError, match=r"commit\(\) forbidden"):
            with other.fenced(pipeline=True) as tx:
                insert_effect(tx, other)
                tx.commit()
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert effects(conn) == [(job.id, 1, "attempt-1")]
    assert [r[0] for r in conn.execute("SELECT k FROM pipe_once ORDER BY k")] == ["mine", "taken"]
    assert (status(conn, job.id), owner(conn, other.id)) == ("done", (1, "owner"))


# -- write-only blocks: Job.fenced_writes() ------------------------------------------


def test_fenced_writes_send_the_block_and_the_completion_as_one_message(dsn, conn, tmp_path):
    """Two queued inserts (values with quotes, a percent sign and JSON), the
    completion and COMMIT: one Query message, one ReadyForQuery, one
    transaction; the values arrive exactly as given."""
    queue = "writes-ok"
    trace = tmp_path / "libpq.trace"
    conn.execute("CREATE TABLE writes_seen (job_id bigint, note text, doc jsonb)")
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue)
        with protocol_trace(c, trace):
            with job.fenced_writes() as writes:
                writes.execute("INSERT INTO writes_seen VALUES (%s, %s, %s)",
                               (job.id, "it's 100% done; DROP TABLE x --", Json({"a": [1, "b'c"]})))
                writes.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                               "key": job.idempotency_key, "worker": "attempt-1"})
                assert trace.read_text() == ""          # nothing sent inside the block
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    messages = [line.split("\t")[0::2][:2] for line in trace.read_text().splitlines()
                if line[:2] in ("F\t", "B\t")]
    assert [name for way, name in messages if way == "F"] == ["Query"]
    assert [name for way, name in messages].count("ReadyForQuery") == 1
    assert job.completed
    assert [tuple(r) for r in conn.execute("SELECT job_id, note, doc FROM writes_seen")] == [
        (job.id, "it's 100% done; DROP TABLE x --", {"a": [1, "b'c"]})]
    assert effects(conn) == [(job.id, 1, "attempt-1")]
    xids = {r[0] for r in conn.execute("SELECT xmin::text FROM writes_seen UNION ALL "
                                       "SELECT xmin::text FROM pgfence_examples.effects UNION ALL "
                                       "SELECT xmin::text FROM pgfence.job_history WHERE id = %s", (job.id,))}
    assert len(xids) == 1
    row = job_row(conn, job.id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("done", 1, None)


def test_fenced_writes_with_a_failing_statement_or_a_raising_block_keep_nothing(dsn, conn, tmp_path):
    """A statement that fails on the server: its error is raised, the insert
    before it and the completion are rolled back.  A block that raises:
    nothing at all is sent.  Either way the job still runs as attempt 1."""
    queue = "writes-error"
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, queue)
        with pytest.raises(PgfenceError, match="division by zero"):
            with job.fenced_writes() as writes:
                insert_effect(writes, job)
                writes.execute("SELECT 1 / %s", (0,))
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with protocol_trace(c, trace):
            with pytest.raises(ValueError, match="card declined"):
                with job.fenced_writes() as writes:
                    insert_effect(writes, job)
                    raise ValueError("card declined")
        assert trace.read_text() == ""
        assert not job.completed and job.lease.lost_reason is None
        assert effects(conn) == []
        assert owner(conn, job.id) == (1, "owner")
        with job.fenced_writes() as writes:
            insert_effect(writes, job)
    assert job.completed
    assert effects(conn) == [(job.id, 1, "attempt-1")]
    assert status(conn, job.id) == "done"
