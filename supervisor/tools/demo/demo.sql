-- name: demo_job
-- One job's state as the demo reports it.
SELECT status, attempt, locked_by
  FROM pgfence.all_jobs
 WHERE id = %(id)s;

-- name: demo_receipts
-- The attempts that committed a receipt for one job, in commit order.
SELECT attempt
  FROM pgfence_examples.receipts
 WHERE job_id = %(id)s
 ORDER BY id;
