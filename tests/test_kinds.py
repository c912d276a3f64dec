"""Each kind's options in the database (pgfence.kinds): written by the
workers at start, applied to every enqueue wherever the producer is."""

from __future__ import annotations

import os
import re
import signal
import socket
import textwrap
from pathlib import Path

import psycopg

from pgtools import env_for, job_row, pgfence, scalar, spawn, wait_for
from pgfence import enqueue
from pgfence.worker import kinds
from pgfence.registry import HandlerSpec

OPTIONS = ("queue", "max_attempts", "max_reclaims")


def options(conn: psycopg.Connection, job_id: int) -> tuple:
    row = job_row(conn, job_id)
    return tuple(row[k] for k in OPTIONS)


def kind_rows(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT kind, queue, max_attempts, max_reclaims, lease, timeout FROM pgfence.kinds "
                        "ORDER BY kind").fetchall()


def spec(kind: str, **opts) -> HandlerSpec:
    return HandlerSpec(kind, lambda job: None, **opts)


def env_with(dsn: str, folder: Path, **extra: str) -> dict[str, str]:
    env = env_for(dsn, **extra)
    # Only the modules a test names: its TOML file's handlers must not be
    # overridden by the environment's.
    if "PGFENCE_HANDLERS" not in extra:
        del env["PGFENCE_HANDLERS"]
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    return env


MAIL_MODULE = textwrap.dedent("""
    import os

    from pgfence import handler
    from pgfence.handlers.tables import INSERT_EFFECT

    @handler("t_mail", queue="mail", max_attempts=2, max_reclaims=1, lease=20, timeout=10)
    def mail(job):
        with job.fenced() as conn:
            conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                         "key": job.idempotency_key, "worker": str(os.getpid())})
""")


def test_a_run_records_its_kinds_and_sql_producers_get_the_handlers_queue_and_limits(dsn, conn, tmp_path):
    (tmp_path / "mailjobs.py").write_text(MAIL_MODULE)
    run = spawn("run", "--workers", "1", "--queues", "mail", "--handlers", "mailjobs",
                env=env_with(dsn, tmp_path))
    try:
        wait_for(lambda: kind_rows(conn), timeout=30, message="the run's kinds recorded")
        assert kind_rows(conn) == [("t_mail", "mail", 2, 1, 20.0, 10.0)]

        # Producers that never imported mailjobs: the SQL function, without
        # options and with NULLs, and a plain INSERT.
        by_function = scalar(conn, "SELECT pgfence.enqueue('t_mail', '{}')")
        by_nulls = scalar(conn, "SELECT pgfence.enqueue('t_mail', '{}', NULL, NULL, NULL, NULL, NULL, NULL)")
        by_insert = scalar(conn, "INSERT INTO pgfence.jobs (kind, payload) VALUES ('t_mail', '{}') RETURNING id")
        for job_id in (by_function, by_nulls, by_insert):
            assert options(conn, job_id) == ("mail", 2, 1)

        # The worker serving `mail` runs them all, once each.
        ids = [by_function, by_nulls, by_insert]
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'done'") == 3,
                 timeout=30, message="the three jobs done")
        assert conn.execute("SELECT id, status, attempt FROM pgfence.all_jobs ORDER BY id").fetchall() == \
            [(i, "done", 1) for i in ids]
        assert conn.execute("SELECT job_id, attempt FROM pgfence_examples.effects ORDER BY job_id").fetchall() == \
            [(i, 1) for i in ids]
    finally:
        run.send_signal(signal.SIGTERM)
        _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err


def kind_record(conn: psycopg.Connection, kind: str) -> tuple:
    return conn.execute("SELECT queue, max_attempts, max_reclaims, lease, timeout, updated_by, updated_at "
                        "FROM pgfence.kinds WHERE kind = %s", [kind]).fetchone()


def test_a_reload_records_the_new_options_by_the_supervisors_instance(dsn, conn, tmp_path):
    """SIGHUP re-imports the handler module: the options it now declares
    reach pgfence.kinds (once the new heartbeat manager is up), and so every
    producer's next enqueue; updated_by names the supervisor by its instance
    id, its row of pgfence.supervisors."""
    module = tmp_path / "mailjobs.py"
    module.write_text(MAIL_MODULE)
    log = (tmp_path / "run.log").open("w")
    run = spawn("run", "--workers", "1", "--queues", "mail,post", "--handlers", "mailjobs",
                env=env_with(dsn, tmp_path, PYTHONDONTWRITEBYTECODE="1"), stdout=log, stderr=log)
    try:
        instance = wait_for(lambda: (row := conn.execute("SELECT instance FROM pgfence.supervisors WHERE pid = %s",
                                                         [run.pid]).fetchone()) and row[0],
                            timeout=30, message="the supervisor's row")
        name = f"{socket.gethostname()}:{run.pid}:{instance}"
        first = kind_record(conn, "t_mail")
        assert first[:6] == ("mail", 2, 1, 20.0, 10.0, name)

        module.write_text(MAIL_MODULE.replace('queue="mail", max_attempts=2, max_reclaims=1, lease=20, timeout=10',
                                              'queue="post", max_attempts=4, max_reclaims=0, lease=30'))
        run.send_signal(signal.SIGHUP)
        now = wait_for(lambda: (row := kind_record(conn, "t_mail"))[0] == "post" and row, timeout=30,
                       message="the reloaded options recorded")
        assert now[:6] == ("post", 4, 0, 30.0, None, name) and now[6] > first[6]
        job_id = scalar(conn, "SELECT pgfence.enqueue('t_mail')")
        assert options(conn, job_id) == ("post", 4, 0)
        wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", [job_id]) == "done",
                 timeout=30, message="the job on the new queue done")
        assert conn.execute("SELECT job_id, attempt FROM pgfence_examples.effects").fetchall() == [(job_id, 1)]
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        log.close()
    text = (tmp_path / "run.log").read_text()
    assert run.returncode == 0, text
    assert "recorded the options of kind(s) t_mail in pgfence.kinds" in text


def test_explicit_options_win_and_unregistered_kinds_get_the_old_defaults(conn):
    assert kinds.register(conn, [spec("t_k", queue="mail", max_attempts=2, max_reclaims=0)], by="test") == ["t_k"]

    def enq(sql: str) -> tuple:
        return options(conn, scalar(conn, sql))

    assert enq("SELECT pgfence.enqueue('t_k')") == ("mail", 2, 0)
    assert enq("SELECT pgfence.enqueue('t_k', p_queue => 'other')") == ("other", 2, 0)
    assert enq("SELECT pgfence.enqueue('t_k', p_max_attempts => 7)") == ("mail", 7, 0)
    assert enq("SELECT pgfence.enqueue('t_k', p_max_reclaims => 4)") == ("mail", 2, 4)
    assert enq("SELECT pgfence.enqueue('t_k', '{}', 'q2', 0, NULL, 9, NULL, 5)") == ("q2", 9, 5)
    assert enq("INSERT INTO pgfence.jobs (kind, queue) VALUES ('t_k', 'q3') RETURNING id") == ("q3", 2, 0)
    assert enq("INSERT INTO pgfence.jobs (kind, queue, max_attempts, max_reclaims) "
               "VALUES ('t_k', 'q4', 1, 1) RETURNING id") == ("q4", 1, 1)
    # A kind nobody registered, or registered without options: the old defaults.
    assert enq("SELECT pgfence.enqueue('t_unknown')") == ("default", 5, 3)
    assert enq("INSERT INTO pgfence.jobs (kind) VALUES ('t_unknown') RETURNING id") == ("default", 5, 3)
    kinds.register(conn, [spec("t_bare")], by="test")
    assert enq("SELECT pgfence.enqueue('t_bare')") == ("default", 5, 3)
    # The notification names the queue the job went to.
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgfence_jobs")
        scalar(conn, "SELECT pgfence.enqueue('t_k')")
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["mail"]


def test_python_enqueue_without_the_handler_leaves_the_options_to_the_database(conn):
    kinds.register(conn, [spec("t_remote", queue="reports", max_attempts=3, max_reclaims=2)], by="test")
    assert options(conn, enqueue(conn, "t_remote")) == ("reports", 3, 2)
    assert options(conn, enqueue(conn, "t_remote", queue="now", max_attempts=1)) == ("now", 1, 2)


def test_register_writes_changed_kinds_only_and_keeps_the_others(conn):
    both = [spec("t_a", queue="a", lease=5), spec("t_b", max_attempts=4)]
    assert kinds.register(conn, both, by="test") == ["t_a", "t_b"]
    first = conn.execute("SELECT kind, updated_at FROM pgfence.kinds ORDER BY kind").fetchall()
    # A restart with the same handlers writes nothing.
    assert kinds.register(conn, both, by="test") == []
    assert conn.execute("SELECT kind, updated_at FROM pgfence.kinds ORDER BY kind").fetchall() == first
    # A new version of t_a (its lease option removed) without t_b: t_a is
    # updated, t_b is kept for the workers that still run it.
    assert kinds.register(conn, [spec("t_a", queue="a", timeout=2)], by="test") == ["t_a"]
    assert kind_rows(conn) == [("t_a", "a", None, None, None, 2.0), ("t_b", None, 4, None, None, None)]
    assert kinds.register(conn, [], by="test") == []
    assert kinds.known(conn, "t_b") and not kinds.known(conn, "t_c")


CFG_MODULE = textwrap.dedent("""
    from pgfence import handler

    @handler("t_cfg", queue="cfgq", max_attempts=3, max_reclaims=0)
    def cfg(job):
        pass
""")


def test_cli_enqueue_finds_handlers_in_the_environment_the_config_file_and_the_database(dsn, conn, tmp_path):
    (tmp_path / "cfgjobs.py").write_text(CFG_MODULE)
    toml = tmp_path / "pgfence.toml"
    toml.write_text('[pgfence]\nhandlers = ["cfgjobs"]\n')

    def enqueue_cli(*args: str, **env: str) -> tuple:
        out = pgfence("enqueue", "t_cfg", *args, env=env_with(dsn, tmp_path, **env))
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        return options(conn, int(out.stdout))

    # No worker has registered t_cfg: only the handler module knows its options.
    refused = pgfence("enqueue", "t_cfg", env=env_with(dsn, tmp_path))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("pgfence: error: unknown job kind 't_cfg' (known: ")
    assert refused.stderr.endswith("); no worker has registered it either (--any-kind enqueues it anyway)\n")
    assert enqueue_cli(PGFENCE_HANDLERS="cfgjobs") == ("cfgq", 3, 0)
    assert enqueue_cli("--config", str(toml)) == ("cfgq", 3, 0)
    assert enqueue_cli(PGFENCE_CONFIG=str(toml)) == ("cfgq", 3, 0)
    assert enqueue_cli("--queue", "x", "--max-attempts", "9", PGFENCE_HANDLERS="cfgjobs") == ("x", 9, 0)
    assert scalar(conn, "SELECT count(*) FROM pgfence.kinds") == 0

    # Once a worker has registered the kind, a bare `pgfence enqueue` takes it.
    work = pgfence("work", "--burst", "--queues", "cfgq", "--handlers", "cfgjobs", env=env_with(dsn, tmp_path))
    assert work.returncode == 0, work.stderr
    assert kind_rows(conn) == [("t_cfg", "cfgq", 3, 0, None, None)]
    # Written by the worker by its name: host, pid and its instance id.
    assert re.fullmatch(re.escape(socket.gethostname()) + r":\d+:[0-9a-f]{8}",
                        scalar(conn, "SELECT updated_by FROM pgfence.kinds WHERE kind = 't_cfg'"))
    assert enqueue_cli() == ("cfgq", 3, 0)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 5
