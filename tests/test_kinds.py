"""Each kind's options in the database (pgfence.kinds): written by the
workers at start, applied to every enqueue wherever the producer is."""

from __future__ import annotations

import os
import signal
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


def test_explicit_options_win_and_unregistered_kinds_get_the_old_defaults(conn):
    assert kinds.register(conn, [spec("t_k", queue="mail", max_attempts=2, max_reclaims=0)]) == ["t_k"]

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
    kinds.register(conn, [spec("t_bare")])
    assert enq("SELECT pgfence.enqueue('t_bare')") == ("default", 5, 3)
    # The notification names the queue the job went to.
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgfence_jobs")
        scalar(conn, "SELECT pgfence.enqueue('t_k')")
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["mail"]


def test_python_enqueue_without_the_handler_leaves_the_options_to_the_database(conn):
    kinds.register(conn, [spec("t_remote", queue="reports", max_attempts=3, max_reclaims=2)])
    assert options(conn, enqueue(conn, "t_remote")) == ("reports", 3, 2)
    assert options(conn, enqueue(conn, "t_remote", queue="now", max_attempts=1)) == ("now", 1, 2)


def test_register_writes_changed_kinds_only_and_keeps_the_others(conn):
    assert kinds.register(conn, [spec("t_a", queue="a", lease=5), spec("t_b", max_attempts=4)]) == ["t_a", "t_b"]
    first = conn.execute("SELECT kind, updated_at FROM pgfence.kinds ORDER BY kind").fetchall()
    # A restart with the same handlers writes nothing.
    assert kinds.register(conn, [spec("t_a", queue="a", lease=5), spec("t_b", max_attempts=4)]) == []
    assert conn.execute("SELECT kind, updated_at FROM pgfence.kinds ORDER BY kind").fetchall() == first
    # A new version of t_a (its lease option removed) without t_b: t_a is
    # updated, t_b is kept for the workers that still run it.
    assert kinds.register(conn, [spec("t_a", queue="a", timeout=2)]) == ["t_a"]
    assert kind_rows(conn) == [("t_a", "a", None, None, None, 2.0), ("t_b", None, 4, None, None, None)]
    assert kinds.register(conn, []) == []
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
    assert enqueue_cli() == ("cfgq", 3, 0)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 5
