"""Queue and kind names (issue 10, point 10): a name no worker can serve
(leading spaces, commas, empty, too long, ``none`` for a queue) is refused
by the CLI with one line, by the Python API with ConfigError, and by the
database for any producer, so that no job waits for ever on it."""

from __future__ import annotations

import psycopg
import pytest

import pgfence.handlers.builtin  # noqa: F401 - registers noop before the registry snapshot
from pgtools import pgfence, scalar
from pgfence import enqueue, handler, names, settings as settings_mod
from pgfence.errors import ConfigError
from pgfence.store import jobs as jobs_store
from pgfence.settings import Settings

BAD = [" padded", "padded ", "a,b", "", "x" * 129, "it's", "ω", "-dash", "a b", "tab\t", "new\nline"]
GOOD = ["default", "a", "x" * 128, "Emails.v2", "billing:eu-1", "9lives", "a_b-c.d:e"]


# -- pure rule, no database ----------------------------------------------------


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_for_queues_and_kinds(name):
    for what in ("queue", "kind"):
        with pytest.raises(ConfigError, match=rf"^invalid {what} name "):
            names.check(name, what)


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass(name):
    assert names.check(name, "queue") == name
    assert names.check(name, "kind") == name


def test_none_is_no_queue_name_but_may_be_a_kind():
    for spelled in ("none", "None", "NONE"):
        with pytest.raises(ConfigError, match="'none' means no value in settings"):
            names.check(spelled, "queue")
        assert names.check(spelled, "kind") == spelled


def test_settings_refuse_a_queue_no_producer_may_use():
    with pytest.raises(ConfigError, match=r"^invalid queues: invalid queue name 'bad!'"):
        settings_mod.load({"queues": "ok,bad!"}, env={})
    with pytest.raises(ConfigError, match=r"^invalid queues: invalid queue name 'bad!'"):
        Settings(queues=("ok", "bad!"))
    assert settings_mod.load({"queues": " a , b "}, env={}).queues == ("a", "b")   # the list's spacing


def test_handler_registration_refuses_bad_kind_and_queue():
    with pytest.raises(ConfigError, match=r"^invalid kind name 'send mail'"):
        handler("send mail")
    with pytest.raises(ConfigError, match=r"^handler 'send_mail': invalid queue name 'a,b'"):
        handler("send_mail", queue="a,b")


# -- Python API and SQL function on a real database -------------------------------


def test_python_enqueue_refuses_bad_names_and_writes_nothing(conn):
    for name in BAD:
        with pytest.raises(ConfigError, match=r"^invalid queue name "):
            enqueue(conn, "noop", queue=name)
        with pytest.raises(ConfigError, match=r"^invalid kind name "):
            enqueue(conn, name)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0
    job_id = enqueue(conn, "noop", queue="billing:eu-1")
    assert scalar(conn, "SELECT queue FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "billing:eu-1"


@pytest.mark.parametrize("column", ["queue", "kind"])
def test_the_sql_function_and_plain_inserts_refuse_bad_names(conn, column):
    for name in BAD + (["none", "NONE"] if column == "queue" else []):
        args = ("noop", name) if column == "queue" else (name, "default")
        with pytest.raises(psycopg.errors.CheckViolation, match=rf"^invalid {column} name "):
            conn.execute("SELECT pgfence.enqueue(%s, '{}', %s)", args)
        with pytest.raises(psycopg.errors.CheckViolation, match=rf"^invalid {column} name "):
            conn.execute("INSERT INTO pgfence.jobs (kind, queue) VALUES (%s, %s)", args)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0
    # A kind's queue from pgfence.kinds is checked once the trigger filled it in.
    conn.execute("INSERT INTO pgfence.kinds (kind, queue) VALUES ('odd', ' padded')")
    with pytest.raises(psycopg.errors.CheckViolation, match=r"^invalid queue name ' padded'"):
        conn.execute("SELECT pgfence.enqueue('odd')")
    # An update that renames is checked; one that leaves names alone is not.
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop', '{}', 'a.b')")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE pgfence.jobs SET queue = 'a,b' WHERE id = %s", (job_id,))
    assert scalar(conn, "SELECT queue FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "a.b"


def test_rows_from_before_the_rule_can_still_be_claimed_and_finished(conn):
    """The rule checks new names only: a job enqueued before it under a name
    now refused (a unicode queue a worker did serve) still changes state.  A
    CHECK constraint, even NOT VALID, would refuse these updates."""
    conn.execute("ALTER TABLE pgfence.jobs DISABLE TRIGGER jobs_names_valid")
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop', '{}', 'ω')")
    conn.execute("ALTER TABLE pgfence.jobs ENABLE TRIGGER jobs_names_valid")
    conn.execute("UPDATE pgfence.jobs SET status = 'running', attempt = attempt + 1, started_at = now(), "
                 "lease_until = now() + interval '30 s', locked_by = 'w' WHERE id = %s", (job_id,))
    # The completion moves it to history, which checks no names.
    assert jobs_store.complete(conn, job_id, 1)
    assert conn.execute("SELECT queue, status FROM pgfence.all_jobs WHERE id = %s", (job_id,)).fetchone() == ("ω", "done")


# -- the command line ------------------------------------------------------------


def test_cli_enqueue_and_work_refuse_bad_names_with_one_line(dsn, conn):
    cases = [
        (["enqueue", "noop", "--queue", " padded"], "invalid queue name ' padded'"),
        (["enqueue", "noop", "--queue", "a,b"], "invalid queue name 'a,b'"),
        (["enqueue", "noop", "--queue", "none"], "invalid queue name 'none'"),
        (["enqueue", "noop", "--queue", ""], "invalid queue name ''"),
        (["enqueue", "noop", "--queue", "q" * 129], "invalid queue name 'qqq"),
        (["enqueue", "bad kind", "--any-kind"], "invalid kind name 'bad kind'"),
        (["work", "--burst", "--queues", "ok,bad!"], "invalid queues: invalid queue name 'bad!'"),
    ]
    for args, fragment in cases:
        out = pgfence(*args, dsn=dsn)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert out.stdout == ""
        assert out.stderr.startswith("pgfence: error: ") and out.stderr.count("\n") == 1, (args, out.stderr)
        assert fragment in out.stderr, (args, out.stderr)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0
