"""The naive loop pgfence started from: claim with UPDATE ... WHERE id IN
(SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING, complete by id alone.
No lease renewal, no fencing token, no reclaim; on pgfence's own table and
partial index, so it is what the table costs with nothing on top.

    python -m drivers.naive_worker DSN BATCH

BATCH 1 is the one-job loop (one claim and one completion per job); a larger
BATCH is the bare batched loop (one claim and one completion per batch).
"""

from __future__ import annotations

import os
import sys

import psycopg

_CLAIM = """
UPDATE pgfence.jobs
   SET status = 'running', attempt = attempt + 1, locked_by = %(worker)s,
       lease_until = now() + interval '30 seconds', started_at = now()
 WHERE id {op} (SELECT id FROM pgfence.jobs
               WHERE queue = 'default' AND status = 'queued' AND run_at <= now()
               ORDER BY priority DESC, run_at, id
               LIMIT %(batch)s
                 FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload
"""
CLAIM_ONE = _CLAIM.format(op="=")
CLAIM_MANY = _CLAIM.format(op="IN")
# A finished job leaves pgfence.jobs for pgfence.job_history (migration
# 0009): the completion moves it, by id alone.
_COMPLETE = """
WITH moved AS (
    DELETE FROM pgfence.jobs WHERE id {cond}
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'done', queue, kind, dedupe_key, payload, last_error, last_traceback)
INSERT INTO pgfence.job_history SELECT * FROM moved
"""
COMPLETE_ONE = _COMPLETE.format(cond="= %(id)s")
COMPLETE_MANY = _COMPLETE.format(cond="= ANY(%(ids)s::bigint[])")


def main(dsn: str, batch: int) -> None:
    worker = f"naive:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        while True:
            rows = conn.execute(CLAIM_ONE if batch == 1 else CLAIM_MANY,
                                {"worker": worker, "batch": batch}).fetchall()
            if not rows:
                return
            if batch == 1:
                conn.execute(COMPLETE_ONE, {"id": rows[0][0]})
            else:
                conn.execute(COMPLETE_MANY, {"ids": [r[0] for r in rows]})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
