"""`pgfence demo` tells its story: two receipts without the protections, one
with them, one when the holder is frozen past its lease (the fence rejects its
late commit)."""

import re

from pgtools import pgfence

COLUMNS = ["act", "job", "receipts rows", "email requests", "emails sent", "job status/attempt",
           "fence rejections"]


def parse_table(stdout: str) -> dict[str, dict[str, str]]:
    """The demo's table: act number -> column -> cell."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if re.split(r"\s{2,}", line.strip()) == COLUMNS)
    rows = {}
    for line in lines[header + 1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(COLUMNS), line
        rows[cells[0].split()[0]] = dict(zip(COLUMNS, cells))
    return rows


def test_demo_tells_the_story(dsn, conn):
    out = pgfence("demo", "--lease", "2", "--render", "5", dsn=dsn, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = parse_table(out.stdout)
    assert sorted(rows) == ["1", "2", "3"]
    got = {act: [row[c] for c in COLUMNS[2:]] for act, row in rows.items()}
    assert got == {
        "1": ["2 (attempts 1,2)", "2", "1", "done/2", "0"],
        "2": ["1 (attempt 1)", "1", "1", "done/1", "0"],
        "3": ["1 (attempt 2)", "2", "1", "done/2", "1 (attempt 1)"],
    }
    assert "as told:" in out.stdout
    assert "UNEXPECTED" not in out.stdout

    # The database agrees, job by job.
    job = {act: int(row["job"]) for act, row in rows.items()}
    receipts = {job_id: attempts for job_id, attempts in conn.execute(
        "SELECT job_id, array_agg(attempt ORDER BY attempt) FROM pgfence_examples.receipts GROUP BY job_id")}
    assert receipts == {job["1"]: [1, 2], job["2"]: [1], job["3"]: [2]}
    states = {job_id: (status, attempt) for job_id, status, attempt in conn.execute(
        "SELECT id, status, attempt FROM pgfence.all_jobs")}
    assert states == {job["1"]: ("done", 2), job["2"]: ("done", 1), job["3"]: ("done", 2)}
    # Each act's job has its own idempotency key, shared by all its attempts.
    keys = dict(conn.execute("SELECT job_id, count(DISTINCT idempotency_key) FROM pgfence_examples.receipts GROUP BY job_id"))
    assert keys == {job["1"]: 1, job["2"]: 1, job["3"]: 1}


def test_demo_refuses_a_render_that_fits_the_lease(dsn, conn):
    out = pgfence("demo", "--lease", "3", "--render", "3", dsn=dsn, timeout=30)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "pgfence: error: invalid --render: the job must render at least a second longer than the lease "
        "(3s) for the double run to happen, got 3s"]
    assert conn.execute("SELECT count(*) FROM pgfence.all_jobs").fetchone()[0] == 0
