"""Job.fenced_writes(): any statement text either commits with the fenced
completion or is refused before anything is sent; the script is encoded as
the connection encodes.

The hostile forms are those of the reliability review (F1, F6): a trailing
``--`` comment that commented out the completion and the COMMIT (the worker
reported done, nothing committed, the session stayed idle in transaction),
trailing semicolons, several statements in one string, unterminated quotes
and comments, and non-ASCII text under a WIN1252 client encoding.
"""

from __future__ import annotations

import psycopg
import pytest

from pgtools import job_row, scalar
from pgfence import enqueue, handler
from pgfence.store import sqltext
from pgfence.errors import NotCommitted, PgfenceError, UnsafeStatement
from test_fence import claimed_job, effects, owner, protocol_trace, status

IDLE = psycopg.pq.TransactionStatus.IDLE


# -- the statement scanner, no database ---------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("INSERT INTO t VALUES (1) -- audit row", "INSERT INTO t VALUES (1)"),
    ("INSERT INTO t VALUES (1);", "INSERT INTO t VALUES (1)"),
    ("  INSERT INTO t VALUES (1) ; ;\n ;  ", "INSERT INTO t VALUES (1)"),
    ("INSERT INTO t VALUES (1); -- done", "INSERT INTO t VALUES (1)"),
    ("INSERT INTO t VALUES (1) /* a /* nested */ comment; */", "INSERT INTO t VALUES (1)"),
    ("-- leading\nINSERT INTO t VALUES (1)", "INSERT INTO t VALUES (1)"),
    ("INSERT INTO t -- a; comment\nVALUES (1)", "INSERT INTO t -- a; comment\nVALUES (1)"),
    ("INSERT INTO t VALUES ('a;b -- c', 'it''s')", "INSERT INTO t VALUES ('a;b -- c', 'it''s')"),
    ("INSERT INTO t VALUES ( E'a\\';b\\\\', 'c')", "INSERT INTO t VALUES ( E'a\\';b\\\\', 'c')"),
    ('INSERT INTO "we;ird""--" VALUES (1)', 'INSERT INTO "we;ird""--" VALUES (1)'),
    ("DO $body$ BEGIN PERFORM 1; END $body$;", "DO $body$ BEGIN PERFORM 1; END $body$"),
    ("SELECT $$;--$$, $1, a$b$ FROM t", "SELECT $$;--$$, $1, a$b$ FROM t"),
    ("ROLLBACK TO SAVEPOINT s1", "ROLLBACK TO SAVEPOINT s1"),
])
def test_one_statement_cuts_what_could_swallow_the_rest(text, expected):
    assert sqltext.one_statement(text) == expected


@pytest.mark.parametrize("text, message", [
    ("INSERT INTO t VALUES (1); DELETE FROM t", "several statements"),
    ("INSERT INTO t VALUES (1);\n-- x\nDELETE FROM t", "several statements"),
    ("INSERT INTO t VALUES ('abc)", r"unterminated string \(missing '\)"),
    ("INSERT INTO t VALUES (E'abc\\')", r"unterminated string"),
    ('INSERT INTO "t VALUES (1)', "unterminated quoted identifier"),
    ("DO $x$ BEGIN END $y$", r"unterminated dollar quote \$x\$"),
    ("INSERT INTO t VALUES (1) /* open /* nested */", r"unterminated /\* comment"),
    ("  ;; -- nothing", "empty statement"),
    ("", "empty statement"),
    ("COMMIT", r"transaction control \(COMMIT\)"),
    ("/* c */ begin", r"transaction control \(BEGIN\)"),
    ("end", r"transaction control \(END\)"),
    ("ROLLBACK", r"transaction control \(ROLLBACK\)"),
    ("START TRANSACTION", r"transaction control \(START\)"),
    ("PREPARE TRANSACTION 'x'", r"transaction control \(PREPARE\)"),
])
def test_one_statement_refuses_what_cannot_be_made_safe(text, message):
    with pytest.raises(UnsafeStatement, match=message):
        sqltext.one_statement(text)


def test_without_standard_strings_a_backslash_escapes_a_plain_quote():
    text = "INSERT INTO t VALUES ('a\\'; DROP TABLE t; --')"
    assert sqltext.one_statement(text, standard_strings=False) == text
    with pytest.raises(UnsafeStatement, match="several statements"):
        sqltext.one_statement(text, standard_strings=True)


# -- against PostgreSQL ----------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "INSERT INTO fw_rows VALUES (%s, 'kept') -- audit row",
    "INSERT INTO fw_rows VALUES (%s, 'kept');",
    "INSERT INTO fw_rows VALUES (%s, 'kept') ;; -- done;",
    "INSERT INTO fw_rows VALUES (%s, 'kept') /* trailing; comment */",
    "INSERT INTO fw_rows -- the table;\nVALUES (%s, 'kept')",
])
def test_hostile_but_safe_statement_text_commits_with_the_completion(dsn, conn, sql):
    """Each form commits the row and the completion together, and leaves
    the connection idle (before the fix, the trailing comment left it idle
    in transaction with nothing committed)."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, "fw-safe")
        with job.fenced_writes() as writes:
            writes.execute(sql, (job.id,))
        assert c.info.transaction_status == IDLE
    assert job.completed
    assert conn.execute("SELECT job_id, note FROM fw_rows").fetchall() == [(job.id, "kept")]
    row = job_row(conn, job.id)
    assert (row["status"], row["attempt"], row["locked_by"]) == ("done", 1, None)


@pytest.mark.parametrize("sql, message", [
    ("INSERT INTO fw_rows VALUES (1, 'a'); INSERT INTO fw_rows VALUES (2, 'b')", "several statements"),
    ("INSERT INTO fw_rows VALUES (1, 'a", "unterminated string"),
    ("INSERT INTO fw_rows VALUES (1, $q$a)", "unterminated dollar quote"),
    ("INSERT INTO fw_rows VALUES (1, 'a') /* open", "unterminated /\\* comment"),
    ("COMMIT", "transaction control"),
])
def test_unsafe_statement_text_is_refused_and_nothing_is_sent(dsn, conn, tmp_path, sql, message):
    """Refused before anything goes to the server: no row, the job still
    runs as attempt 1, and the same job then completes normally."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, "fw-unsafe")
        with protocol_trace(c, trace):
            with pytest.raises(UnsafeStatement, match=message):
                with job.fenced_writes() as writes:
                    writes.execute(sql)
        assert trace.read_text() == ""
        assert c.info.transaction_status == IDLE
        assert not job.completed and job.lease.lost_reason is None
        assert owner(conn, job.id) == (1, "owner")
        assert scalar(conn, "SELECT count(*) FROM fw_rows") == 0
        with job.fenced_writes() as writes:
            writes.execute("INSERT INTO fw_rows VALUES (%s, 'later')", (job.id,))
    assert conn.execute("SELECT job_id, note FROM fw_rows").fetchall() == [(job.id, "later")]
    assert status(conn, job.id) == "done"


def test_a_block_whose_commit_did_not_run_is_rolled_back_and_raises(dsn, conn):
    """The check after the round trip, the net under the scanner: the F1
    script as the server ran it (BEGIN, the write, the completion, the
    COMMIT swallowed) leaves the connection in a transaction; NotCommitted
    is raised, the transaction rolled back, the job not taken as done."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, "fw-net")
        with pytest.raises(NotCommitted, match=r"did not commit \(3 of 4 statements answered, last 'SELECT 1', "
                                               r"connection INTRANS\)"):
            with job._raising_fence(c), psycopg.ClientCursor(c) as cursor:
                cursor.execute("BEGIN; INSERT INTO fw_rows VALUES (%s, 'lost'); "
                               "SELECT pgfence.complete_fenced(%s, 1) -- ; COMMIT" % (job.id, job.id))
                job._check_committed(c, cursor, 2)
        assert isinstance(NotCommitted("x"), PgfenceError)
        assert c.info.transaction_status == IDLE
    assert not job.completed
    assert scalar(conn, "SELECT count(*) FROM fw_rows") == 0
    assert owner(conn, job.id) == (1, "owner")


def test_a_block_whose_answers_do_not_match_raises(dsn, conn, monkeypatch):
    """Should a second statement ever slip past the scanner, the answers
    outnumber the statements sent: NotCommitted, not a silent success."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    monkeypatch.setattr(sqltext, "one_statement", lambda text, **_: text.strip())
    with psycopg.connect(dsn, autocommit=True) as c:
        job = claimed_job(conn, c, "fw-net2")
        with pytest.raises(NotCommitted, match=r"5 of 4 statements answered"):
            with job.fenced_writes() as writes:
                writes.execute("INSERT INTO fw_rows VALUES (%s, 'a'); SELECT 1", (job.id,))
        assert c.info.transaction_status == IDLE
    assert not job.completed


def test_worker_with_a_trailing_comment_commits_every_job(dsn, conn, make_worker):
    """The review's reproduction: three jobs whose handler's statement ends
    in a ``--`` comment.  Each row is written, each job done, and the
    worker's session is not left idle in transaction."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")

    @handler("fw_comment")
    def fw_comment(job):
        with job.fenced_writes() as writes:
            writes.execute("INSERT INTO fw_rows VALUES (%s, 'ok') -- audit row", (job.id,))

    ids = [enqueue(conn, "fw_comment", queue="fw") for _ in range(3)]
    worker = make_worker(queues=("fw",), retention=None)
    stats = worker.run(burst=True)
    assert stats.outcomes == {"done": 3}
    assert conn.execute("SELECT job_id FROM fw_rows ORDER BY job_id").fetchall() == [(i,) for i in ids]
    assert conn.execute("SELECT id, status, attempt FROM pgfence.all_jobs ORDER BY id").fetchall() == \
        [(i, "done", 1) for i in ids]
    assert scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state = 'idle in transaction'") == 0


@pytest.mark.parametrize("encoding", ["WIN1252", "LATIN9"])
def test_fenced_writes_encode_as_the_connection_does(dsn, conn, encoding):
    """Under a non-UTF-8 client encoding the text arrives exactly as given
    (before the fix 'café €' was stored as 'cafÃ© â‚¬'), as through fenced()."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"SET client_encoding TO '{encoding}'")
        job = claimed_job(conn, c, "fw-enc")
        with job.fenced_writes() as writes:
            writes.execute("INSERT INTO fw_rows VALUES (%s, %s)", (job.id, "café €"))
            writes.execute("INSERT INTO fw_rows VALUES (%s, 'señor €') -- é", (-job.id,))
    assert conn.execute("SELECT job_id, note, octet_length(note) FROM fw_rows ORDER BY job_id DESC").fetchall() == [
        (job.id, "café €", 9), (-job.id, "señor €", 10)]
    assert status(conn, job.id) == "done"
    assert effects(conn) == []


def test_statements_are_scanned_as_a_session_without_standard_strings_reads_them(dsn, conn, tmp_path):
    """With standard_conforming_strings off, a backslash escapes a quote in a
    plain '...' string, so this text is two statements to the server: the
    INSERT and a DELETE of every row.  It is refused before anything is
    sent.  Before the fix the session's setting was compared with bytes
    (always unequal to the str psycopg returns), the text was scanned as
    one statement, and the DELETE ran inside the fenced block."""
    conn.execute("CREATE TABLE fw_rows (job_id bigint, note text)")
    conn.execute("INSERT INTO fw_rows VALUES (0, 'earlier')")
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET standard_conforming_strings TO off")
        job = claimed_job(conn, c, "fw-scs")
        with protocol_trace(c, trace):
            with pytest.raises(UnsafeStatement, match="several statements"):
                with job.fenced_writes() as writes:
                    writes.execute("INSERT INTO fw_rows VALUES (%s, 'a\\', '); DELETE FROM fw_rows; --')",
                                   (job.id,))
        assert trace.read_text() == ""
        assert c.info.transaction_status == IDLE
        assert not job.completed
        assert owner(conn, job.id) == (1, "owner")
    assert conn.execute("SELECT job_id, note FROM fw_rows").fetchall() == [(0, "earlier")]
