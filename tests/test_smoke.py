from pgtools import job_row, pgfence, scalar


def test_enqueue_and_work_burst(dsn, conn):
    out = pgfence("enqueue", "effect", "--payload", '{"seconds": 0}', dsn=dsn)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout)
    out = pgfence("work", "--burst", "--lease", "5", dsn=dsn)
    assert out.returncode == 0, out.stderr
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("done", 1)
    assert scalar(conn, "SELECT count(*) FROM pgfence_examples.effects WHERE job_id = %s", (job_id,)) == 1
