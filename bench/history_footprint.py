"""Bytes a finished no-op job costs, before and after migration 0009.

    python bench/history_footprint.py [ADMIN_DSN] [JOBS]

Makes two scratch databases: one migrated up to 0008, where finished jobs
stay in pgfence.jobs, and one fully migrated, where they move to
pgfence.job_history.  In each, JOBS no-op jobs are enqueued, claimed and
completed 100 at a time (the claim's writes, then complete_many, or 0008's
batched completion), then the tables are vacuumed, and the script prints
pg_total_relation_size (heap, indexes, TOAST) of where the finished jobs
live, per job: pgfence.jobs for the first, every partition of
pgfence.job_history (its indexes by id and of failed jobs included) for the
second.  Sizes are deterministic, not timings: no need to interleave runs.
"""

from __future__ import annotations

from scratch import admin_dsn, argv, scratch_database

from pgfence.store.queries import q

#: The claim's writes to a job (0008's claim statement needs no 0009 function).
CLAIM = """
UPDATE pgfence.jobs
   SET status = 'running', attempt = attempt + 1, locked_by = 'bench-host:12345:w1:0a1b2c3d',
       lease_until = now() + interval '30 seconds', started_at = now()
 WHERE id IN (SELECT id FROM pgfence.jobs WHERE status = 'queued' ORDER BY id LIMIT 100 FOR UPDATE)
RETURNING id, attempt"""

OLD_COMPLETE_MANY = """
UPDATE pgfence.jobs SET status = 'done', finished_at = now(), locked_by = NULL, lease_until = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'"""

SIZE_OLD = "SELECT pg_total_relation_size('pgfence.jobs')"
SIZE_NEW = """SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits
               WHERE inhparent = 'pgfence.job_history'::regclass"""


def run(admin: str, upto: int | None, jobs: int) -> float:
    with scratch_database(admin, upto) as conn:
        conn.execute("SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, %s)", (jobs,))
        while True:
            rows = conn.execute(CLAIM).fetchall()
            if not rows:
                break
            ids, attempts = [r[0] for r in rows], [r[1] for r in rows]
            if upto is None:
                conn.execute(q("complete_many"), {"ids": ids, "attempts": attempts})
            else:
                conn.execute(OLD_COMPLETE_MANY, {"ids": ids})
        conn.execute("VACUUM pgfence.jobs")
        size = conn.execute(SIZE_NEW if upto is None else SIZE_OLD).fetchone()[0]
        return float(size) / jobs


def main() -> None:
    admin = admin_dsn()
    jobs = argv(2, 100_000)
    old = run(admin, 8, jobs)
    new = run(admin, None, jobs)
    print(f"{jobs} finished no-op jobs, bytes per job (pg_total_relation_size):")
    print(f"  0008, pgfence.jobs:        {old:7.1f}")
    print(f"  0009, pgfence.job_history: {new:7.1f}")


if __name__ == "__main__":
    main()
