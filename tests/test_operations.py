"""Pause and resume a queue (store, CLI, every worker flavour, the gauge,
a real `pgfence run`), and the supervisors registry kept by `pgfence run`'s
heartbeat manager (migration 0012)."""

from __future__ import annotations

import socket

import psycopg
import pytest

from pgtools import pgfence, scalar, wait_for
from pgfence import enqueue
from pgfence.observe import metrics
from pgfence.observe.server import MetricsServer
from pgfence.prefork.slots import SlotTable
from pgfence.settings import Settings
from pgfence.store import operations


def status(conn: psycopg.Connection, job_id: int) -> str | None:
    return scalar(conn, "SELECT max(status) FROM pgfence.all_jobs WHERE id = %s", (job_id,))


def statuses(conn: psycopg.Connection, ids: list[int]) -> list[str]:
    return [status(conn, job_id) or "" for job_id in ids]


# -- the CLI ---------------------------------------------------------------------


def test_pause_and_resume_from_the_cli_are_idempotent_and_say_what_they_did(conn, dsn):
    out = pgfence("pause", "emails", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (
        0, "paused queue emails: its jobs are not claimed until `pgfence resume emails`\n", "")
    paused_at = scalar(conn, "SELECT paused_at FROM pgfence.queue_pauses WHERE queue = 'emails'")
    out = pgfence("pause", "emails", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (
        0, f"queue emails was already paused (since {paused_at.isoformat(timespec='seconds')})\n", "")
    assert conn.execute("SELECT queue, paused_by LIKE 'cli %' FROM pgfence.queue_pauses").fetchall() == \
        [("emails", True)]

    out = pgfence("resume", "emails", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "resumed queue emails\n", "")
    out = pgfence("resume", "emails", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "queue emails was not paused\n", "")
    assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses") == 0


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_a_bad_queue_name_is_one_line_and_exit_2(dsn, command):
    out = pgfence(command, "no good", dsn=dsn)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("pgfence: error: invalid queue name 'no good'")


def test_pause_and_resume_notify_pgfence_pauses(conn, dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgfence_pauses")
        assert operations.pause(conn, "q1", by="test") is not None
        assert operations.pause(conn, "q1") is None          # already paused: no second notification
        assert operations.resume(conn, "q1") is not None
        assert operations.resume(conn, "q1") is None
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=1.0, stop_after=2)]
    assert notes == [("pgfence_pauses", "q1"), ("pgfence_pauses", "q1")]


# -- workers ------------------------------------------------------------------------


def test_a_worker_leaves_paused_queues_out_of_its_claims_and_learns_of_a_resume(conn, make_worker):
    worker = make_worker("w-pause", queues=["a", "b"])
    operations.pause(conn, "a")
    a_jobs = [enqueue(conn, "noop", queue="a") for _ in range(3)]
    b_job = enqueue(conn, "noop", queue="b")
    assert [j.id for j in worker.claim(10)] == [b_job]
    assert worker.paused == frozenset({"a"})
    assert worker.claim(10) == []

    operations.resume(conn, "a")
    # The NOTIFY is read before the next claim: no idle wait needed.
    wait_for(lambda: worker.claim(10) or None, timeout=5, message="a claim after the resume")
    assert statuses(conn, a_jobs) == ["running"] * 3
    assert worker.paused == frozenset()


def test_the_paused_gauge_follows_pause_and_resume(conn, dsn, tmp_path, monkeypatch):
    # The server's collector wants a multiprocess directory; this process's
    # own gauges stay in memory, where the test reads them.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with socket.socket() as sock:
        server = MetricsServer(sock, dsn, SlotTable(1, 1), 1.0, settings=Settings(queues=["a", "b"]))
        operations.pause(conn, "a")
        operations.pause(conn, "elsewhere")
        server.refresh_queues()
        value = lambda queue: metrics.QUEUE_PAUSED.labels(queue)._value.get()  # noqa: E731
        assert (value("a"), value("b"), value("elsewhere")) == (1.0, 0.0, 1.0)
        operations.resume(conn, "a")
        operations.resume(conn, "elsewhere")
        server.refresh_queues()
        assert (value("a"), value("b"), value("elsewhere")) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("flavour", [[], ["--threads", "4"], ["--handlers", "pgfence.handlers.aio"]],
                         ids=["one-at-a-time", "threads", "event-loop"])
def test_a_running_supervisor_stops_claiming_a_paused_queue_and_resumes(conn, dsn, runs, flavour):
    # The event-loop flavour has async handlers alone: its loop claims for itself.
    sleep, noop = ("async_sleep", "async_sleep") if "--handlers" in flavour else ("sleep", "noop")
    runs(dsn, "--queues", "a,b", "--workers", "1", *flavour)
    slow = enqueue(conn, sleep, {"seconds": 1.5}, queue="a")
    wait_for(lambda: status(conn, slow) == "running", timeout=20, message="the slow job to run")

    out = pgfence("pause", "a", dsn=dsn)
    assert out.returncode == 0, out.stderr
    held = [enqueue(conn, noop, {"seconds": 0}, queue="a") for _ in range(3)]
    first_b = enqueue(conn, noop, {"seconds": 0}, queue="b")
    # b's job, enqueued after a's (a claim takes a's first, by run_at), runs;
    # a's wait, and the job that was running when the pause came finishes.
    wait_for(lambda: statuses(conn, [first_b, slow]) == ["done", "done"], timeout=20,
             message="b's job and the running job to finish")
    assert statuses(conn, held) == ["queued"] * 3
    second_b = enqueue(conn, noop, {"seconds": 0}, queue="b")
    wait_for(lambda: status(conn, second_b) == "done", timeout=20, message="b's second job")
    assert statuses(conn, held) == ["queued"] * 3

    out = pgfence("resume", "a", dsn=dsn)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: statuses(conn, held) == ["done"] * 3, timeout=20, message="a's jobs to run after the resume")


# -- the supervisors registry ---------------------------------------------------------


def test_a_running_supervisor_keeps_its_row_with_its_children_and_their_jobs_and_removes_it_on_stop(
        conn, dsn, runs):
    # A short drain at the end: the job below sleeps 30 s.
    run = runs(dsn, "--workers", "2", "--queues", "default", "--graceful-timeout", "0.5")
    # The row is written every few seconds: its first may list one child
    # when the second was still starting (seen with two tests at a time).
    up = wait_for(lambda: (rows := operations.supervisors_up(conn)) and len(rows[0].children) == 2 and rows,
                  timeout=20, message="the supervisor's row with its two children")
    [row] = up
    assert (row.host, row.pid, row.workers) == (socket.gethostname(), run.proc.pid, 2)
    assert row.version and row.seen_ago < 10
    assert len(row.children) == 2 and all(c["jobs"] == [] for c in row.children)
    child_pids = {c["pid"] for c in row.children}
    assert child_pids <= set(run.descendants())

    job_id = enqueue(conn, "sleep", {"seconds": 30})
    wait_for(lambda: status(conn, job_id) == "running", timeout=20, message="the job to run")
    holder = scalar(conn, "SELECT locked_by FROM pgfence.jobs WHERE id = %s", (job_id,))

    def running_in_registry():
        [row] = operations.supervisors_up(conn)
        jobs = [(c["pid"], j) for c in row.children for j in c["jobs"]]
        return jobs or None

    jobs = wait_for(running_in_registry, timeout=20, message="the job in the registry")
    assert jobs == [(int(holder.split(":")[1]), {"id": job_id, "kind": "sleep", "queue": "default", "attempt": 1})]
    started = scalar(conn, "SELECT started_at FROM pgfence.supervisors")
    first_seen = scalar(conn, "SELECT last_seen FROM pgfence.supervisors")
    wait_for(lambda: scalar(conn, "SELECT last_seen FROM pgfence.supervisors") > first_seen, timeout=15,
             message="a refresh of last_seen")
    assert scalar(conn, "SELECT started_at FROM pgfence.supervisors") == started

    run.stop()
    assert scalar(conn, "SELECT count(*) FROM pgfence.supervisors") == 0
    assert operations.supervisors_up(conn) == []


def test_only_supervisors_seen_lately_are_up(conn):
    conn.execute("""INSERT INTO pgfence.supervisors (instance, host, pid, workers, version, started_at, last_seen)
                    VALUES ('fresh', 'h1', 10, 2, '0.2.0', now() - interval '1 hour', now() - interval '5 seconds'),
                           ('stale', 'h2', 11, 2, '0.2.0', now() - interval '1 hour', now() - interval '31 seconds')""")
    assert [s.instance for s in operations.supervisors_up(conn)] == ["fresh"]
    assert [s.instance for s in operations.supervisors_up(conn, within=60)] == ["fresh", "stale"]
