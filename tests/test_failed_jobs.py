"""A failed job's error is easy to see (issue 9, point 6): its traceback is
kept (capped), failures and retries are logged at WARNING, and `pgfence
failed` lists the newest failures with their errors, escaped."""

from __future__ import annotations

import json
import re

import pgfence.handlers.builtin  # noqa: F401 - registers noop, sleep, fail before the registry snapshot
from pgtools import env_for, job_row, pgfence, scalar
from pgfence import enqueue, errortext, handler
from pgfence.worker.outcomes import FAILED, RETRIED

LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING pgfence\.worker: (.*)$")


def test_a_raising_handler_keeps_its_traceback(conn, make_worker):
    @handler("t_charge")
    def charge_the_card(job):
        raise ConnectionError("gateway said no")

    job_id = enqueue(conn, "t_charge", max_attempts=1)
    worker = make_worker("w-tb")
    [job] = worker.claim()
    assert worker.run_job(job) == FAILED
    row = job_row(conn, job_id)
    assert (row["status"], row["last_error"]) == ("failed", "ConnectionError: gateway said no")
    tb = row["last_traceback"]
    assert tb.startswith("Traceback (most recent call last):\n")
    assert ", in charge_the_card\n" in tb
    assert '    raise ConnectionError("gateway said no")\n' in tb
    assert tb.endswith("\nConnectionError: gateway said no")


def test_a_huge_error_is_capped_in_both_columns(conn, make_worker):
    @handler("t_huge")
    def huge(job):
        raise RuntimeError("x" * 1_000_000)

    job_id = enqueue(conn, "t_huge", max_attempts=2)
    worker = make_worker("w-huge")
    [job] = worker.claim()
    assert worker.run_job(job) == RETRIED
    row = job_row(conn, job_id)
    assert row["last_error"] == "RuntimeError: " + "x" * (2000 - len("RuntimeError: "))
    assert len(row["last_traceback"]) == errortext.TRACEBACK_CAP == 16_384
    assert ", in huge\n" in row["last_traceback"]
    assert "characters, cut to 16384] ...\n" in row["last_traceback"]
    assert row["last_traceback"].endswith("x" * 1000)


def test_an_error_without_traceback_clears_the_previous_one(conn, make_worker):
    job_id = enqueue(conn, "fail", {"message": "first"}, max_attempts=3)
    worker = make_worker("w-clear", backoff_base=0.01)
    [job] = worker.claim()
    assert worker.run_job(job) == RETRIED
    assert job_row(conn, job_id)["last_traceback"].endswith("RuntimeError: first")
    # The heartbeat's report for a dead worker has no traceback: the row must
    # not keep the previous error's.
    conn.execute("UPDATE pgfence.jobs SET run_at = now() WHERE id = %s", (job_id,))
    [job] = worker.claim()
    worker.heartbeat.release([(job.id, job.attempt, False, "worker died while running it")])
    row = job_row(conn, job_id)
    assert (row["status"], row["last_error"], row["last_traceback"]) == \
        ("queued", "worker died while running it", None)


def test_failures_and_retries_are_logged_at_warning_without_the_payload(dsn, conn):
    job_id = enqueue(conn, "fail", {"message": "smtp \x1b[31mdown\nsecond line", "secret": "hunter2"},
                     max_attempts=2)
    out = pgfence("work", "--max-jobs", "2", "--poll-interval", "0.2", "--log-level", "WARNING",
                  env=env_for(dsn, PGFENCE_BACKOFF_BASE="0.01"), timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [LOG.match(line) for line in out.stderr.splitlines()]
    assert all(lines), out.stderr
    messages = [m.group(1) for m in lines]
    assert len(messages) == 2, messages
    assert re.fullmatch(rf"job {job_id} \(fail\) attempt 1 failed, retrying in 0\.0\ds \(1 of 2 attempts spent\): "
                        r"RuntimeError: smtp \\x1b\[31mdown", messages[0]), messages[0]
    assert messages[1] == (f"job {job_id} (fail) attempt 2 failed for good (2 of 2 attempts spent): "
                           "RuntimeError: smtp \\x1b[31mdown")
    assert "hunter2" not in out.stderr and "\x1b" not in out.stderr
    assert job_row(conn, job_id)["status"] == "failed"


def utc(dsn: str) -> dict[str, str]:
    """The environment of a pgfence command whose session shows times in UTC."""
    return env_for(dsn, PGTZ="UTC")


def failed_rows(conn):
    """Three failed jobs with known finish times, newest last inserted first
    in the listing; one with hostile text; and jobs in other states."""
    ids = []
    for kind, queue, error, tb, age in [
        ("fail", "default", "RuntimeError: old", "Traceback (most recent call last):\nRuntimeError: old", 300),
        ("mail", "mail", "OSError: \x1b[2J\x1b[31mcleared\r\nfake line",
         "Traceback:\n  \x1b]0;pwned\x07\nOSError", 200),
        ("fail", "default", "payload rejected: no email", None, 100),
    ]:
        ids.append(scalar(conn, """
            INSERT INTO pgfence.job_history (kind, queue, status, attempt, putbacks, max_attempts, started_at,
                                             finished_at, created_at, last_error, last_traceback)
            VALUES (%s, %s, 'failed', 3, 1, 5, now(), timestamptz '2026-12-01 12:00:00+00' - make_interval(secs => %s),
                    timestamptz '2026-12-01 11:00:00+00', %s, %s)
            RETURNING id""", (kind, queue, age, error, tb)))
    enqueue(conn, "noop")
    conn.execute("INSERT INTO pgfence.job_history (kind, status, finished_at, last_error) "
                 "VALUES ('noop', 'cancelled', now(), 'cancelled by an operator')")
    return ids


def test_pgfence_failed_lists_newest_first_with_errors_escaped(dsn, conn):
    old, hostile, newest = failed_rows(conn)
    out = pgfence("failed", env=utc(dsn))
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert out.stdout.splitlines() == [
        "        id  failed at            queue        kind             attempts  error",
        f"{newest:>10}  2026-12-01 11:58:20  default      fail                  2/5  payload rejected: no email",
        f"{hostile:>10}  2026-12-01 11:56:40  mail         mail                  2/5  "
        "OSError: \\x1b[2J\\x1b[31mcleared\\r\\nfake line",
        f"{old:>10}  2026-12-01 11:55:00  default      fail                  2/5  RuntimeError: old",
    ]
    out = pgfence("failed", "--traceback", "--kind", "mail", env=utc(dsn))
    assert out.returncode == 0 and "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert out.stdout.splitlines()[1:] == [
        f"{hostile:>10}  2026-12-01 11:56:40  mail         mail                  2/5  "
        "OSError: \\x1b[2J\\x1b[31mcleared\\r\\nfake line",
        "            Traceback:",
        "              \\x1b]0;pwned\\x07",
        "            OSError",
    ]
    out = pgfence("failed", "--queue", "default", "--limit", "1", env=utc(dsn))
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == [str(newest)]


def test_pgfence_failed_json_has_exact_fields(dsn, conn):
    old, hostile, newest = failed_rows(conn)
    out = pgfence("failed", "--json", "--limit", "2", env=utc(dsn))
    assert (out.returncode, out.stderr) == (0, "")
    assert "\x1b" not in out.stdout
    data = json.loads(out.stdout)
    assert data == [
        {"id": newest, "queue": "default", "kind": "fail", "attempt": 3, "attempts_spent": 2, "max_attempts": 5,
         "reclaims": 0, "created_at": "2026-12-01T11:00:00+00:00", "finished_at": "2026-12-01T11:58:20+00:00",
         "last_error": "payload rejected: no email", "traceback": None},
        {"id": hostile, "queue": "mail", "kind": "mail", "attempt": 3, "attempts_spent": 2, "max_attempts": 5,
         "reclaims": 0, "created_at": "2026-12-01T11:00:00+00:00", "finished_at": "2026-12-01T11:56:40+00:00",
         "last_error": "OSError: \x1b[2J\x1b[31mcleared\r\nfake line",
         "traceback": "Traceback:\n  \x1b]0;pwned\x07\nOSError"},
    ]


def test_pgfence_failed_with_none_and_bad_limit(dsn):
    out = pgfence("failed", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "no failed jobs\n", "")
    out = pgfence("failed", "--json", dsn=dsn)
    assert (out.returncode, json.loads(out.stdout)) == (0, [])
    out = pgfence("failed", "--limit", "0", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == \
        (2, "", "pgfence: error: invalid --limit: must be at least 1, got 0\n")


def test_failed_jobs_listing_reads_the_failed_index(conn):
    # 40,000 finished jobs, a tenth of them failed: half in today's
    # partition, half in the default one (10 days old, a day with none).
    conn.execute("""INSERT INTO pgfence.job_history (kind, status, finished_at)
                    SELECT 'noop', CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'done' END,
                           now() - make_interval(secs => g % 3600) - (g % 2) * interval '10 days'
                      FROM generate_series(1, 40000) g""")
    failed_rows(conn)
    conn.execute("ANALYZE pgfence.job_history")
    from pgfence.store.queries import q

    plan = conn.execute("EXPLAIN (FORMAT JSON) " + q("failed_jobs"),
                        {"limit": 20, "queue": None, "kind": None}).fetchone()[0][0]["Plan"]
    text = json.dumps(plan)
    # The partitions that hold jobs are read through their copies of
    # job_history_failed_idx and merged in order: nothing is sorted, and
    # neither holder is read whole (the empty days ahead cost nothing).
    scans = {n["Relation Name"]: (n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)
             if "Relation Name" in n}
    today = conn.execute("SELECT 'job_history_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')").fetchone()[0]
    for holder in (today, "job_history_default"):
        assert scans[holder] == ("Index Scan", f"{holder}_finished_at_id_idx"), text
    assert '"Node Type": "Sort"' not in text, text


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
