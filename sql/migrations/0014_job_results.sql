-- A job's result: the JSON its handler returned, stored with the job when
-- it is done and kept in history with it (dropped with its partition by
-- retention).  Only history holds the column: a result is written by the
-- fenced completion itself, which moves the job to history in the same
-- statement, or, for a handler whose fenced block completed the job before
-- it returned, by one update of that history row afterwards.  NULL: the
-- handler returned None, its kind stores no result (``result=False``), or
-- the job is not done.  Added last, after ``worker``, so that every
-- statement that moves a job to history and does not name it leaves it
-- NULL; only the completions name it.
ALTER TABLE pgfence.job_history ADD COLUMN result jsonb;

-- all_jobs (0012) with the result: NULL for live jobs.
CREATE OR REPLACE VIEW pgfence.all_jobs AS
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       locked_by, lease_until, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, locked_by AS worker, NULL::jsonb AS result
  FROM pgfence.jobs
UNION ALL
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       NULL::text, NULL::timestamptz, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, worker, result
  FROM pgfence.job_history;
