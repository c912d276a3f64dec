-- The statements of pgfence's Django tasks backend (pgfence.store.tasks).

-- name: task_enqueue
-- Enqueue one task's job through the SQL function, in the caller's
-- transaction (Django's own connection, inside its atomic block if any),
-- and return its id with its created_at: the transaction's now(), which
-- the new row's created_at defaults to, so Django's TaskResult.enqueued_at
-- is known without a second round trip.  A task has no dedupe key, so the
-- id is always a new row's.  Parameters by position: kind, payload, queue,
-- priority, run_at (NULL: now), max_attempts (NULL: the kind's).
SELECT pgfence.enqueue(%s, %s::jsonb, %s, %s, coalesce(%s::timestamptz, now()), %s) AS id,
       now() AS enqueued_at;

-- name: task_enqueue_default
-- task_enqueue for a task at Django's defaults but its queue (priority 0,
-- no run_after, the kind's or the default attempts): three parameters to
-- send rather than six.
SELECT pgfence.enqueue(%s, %s::jsonb, %s) AS id, now() AS enqueued_at;

-- name: task_result_pending
-- Whether the result of the done task ``id`` is still to be written: its
-- fenced block committed the job's completion, and its worker writes the
-- result once the task returns (a task's result is always stored, JSON
-- null for None).  After ``grace`` seconds on the database clock a missing
-- result is taken as lost (the worker stopped between the two writes).
SELECT result IS NULL AND finished_at > now() - make_interval(secs => %(grace)s) AS pending
  FROM pgfence.job_history
 WHERE id = %(id)s AND status = 'done';
