-- The statements of pgfence's Django tasks backend (pgfence.store.tasks).

-- name: task_enqueue
-- Enqueue one task's job through the SQL function, in the caller's
-- transaction (Django's own connection, inside its atomic block if any),
-- and return its id with its created_at: the transaction's now(), which
-- the new row's created_at defaults to, so Django's TaskResult.enqueued_at
-- is known without a second round trip.  A task has no dedupe key, so the
-- id is always a new row's.
SELECT pgfence.enqueue(%(kind)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
                       coalesce(%(run_at)s::timestamptz, now()), %(max_attempts)s, NULL, NULL) AS id,
       now() AS enqueued_at;
