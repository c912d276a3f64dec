-- name: status_counts
-- Jobs per queue and status.
SELECT queue, status, count(*)::bigint AS jobs
  FROM pgfence.jobs
 GROUP BY queue, status
 ORDER BY queue, status;

-- name: running_jobs
-- Running jobs with their owner, attempt and the lease left (negative once
-- it has run out), by the database clock.
SELECT id, queue, kind, attempt, locked_by,
       extract(epoch FROM (lease_until - now()))::float8 AS lease_left
  FROM pgfence.jobs
 WHERE status = 'running'
 ORDER BY id;

-- name: retry
-- Put failed or cancelled jobs back in the queue (those of %(ids)s, or with
-- %(all_failed)s every failed job) with a fresh budget of attempts on top of
-- those spent (attempt - putbacks: see put_back_unknown in jobs.sql).
-- Running, queued and done jobs are left alone.  A job whose
-- dedupe key a live (queued or running) job of its kind holds is skipped,
-- and so is every candidate but the oldest of those sharing one key: putting
-- it back would break jobs_dedupe_idx and abort the whole statement.  One
-- row per candidate: requeued or not, and the id of the job that holds its
-- key (the live job, else the candidate requeued in its place).  Rows are
-- locked in id order, like every statement that locks many jobs.
WITH cand AS (
    SELECT id, kind, dedupe_key FROM pgfence.jobs
     WHERE (id = ANY(%(ids)s::bigint[]) AND status IN ('failed', 'cancelled'))
        OR (%(all_failed)s::boolean AND status = 'failed')
     ORDER BY id      -- locked in id order, as every multi-row owner statement
       FOR UPDATE
), verdict AS (
    SELECT c.id,
           (SELECT l.id FROM pgfence.jobs l
             WHERE c.dedupe_key IS NOT NULL AND l.kind = c.kind AND l.dedupe_key = c.dedupe_key
               AND l.status IN ('queued', 'running')
             LIMIT 1) AS live,
           (SELECT min(o.id) FROM cand o
             WHERE c.dedupe_key IS NOT NULL AND o.kind = c.kind AND o.dedupe_key = c.dedupe_key) AS first
      FROM cand c
), requeued AS (
    UPDATE pgfence.jobs j
       SET status = 'queued', run_at = now(), finished_at = NULL, locked_by = NULL,
           lease_until = NULL, max_attempts = attempt - putbacks + %(extra_attempts)s, reclaims = 0
      FROM verdict v
     WHERE j.id = v.id AND v.live IS NULL AND (v.first IS NULL OR v.first = v.id)
    RETURNING j.id
)
SELECT v.id, r.id IS NOT NULL AS requeued, CASE WHEN r.id IS NULL THEN coalesce(v.live, v.first) END AS holder
  FROM verdict v LEFT JOIN requeued r ON r.id = v.id
 ORDER BY v.id;

-- name: cancel_ids
-- Cancel queued or running jobs.  A running job's owner learns it at its next
-- renewal (reason cancelled) and its completion is rejected by the fence.
UPDATE pgfence.jobs
   SET status = 'cancelled', finished_at = now(), locked_by = NULL, lease_until = NULL,
       last_error = coalesce(last_error, 'cancelled by an operator')
 WHERE id IN (SELECT id FROM pgfence.jobs
               WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'running')
               ORDER BY id
                 FOR UPDATE)
   AND status IN ('queued', 'running')
RETURNING id;

-- name: prune_batch
-- Delete up to %(batch)s finished jobs older than the retention, oldest
-- first.  Called in a loop until it deletes fewer than a batch.
DELETE FROM pgfence.jobs
 WHERE id IN (
    SELECT id FROM pgfence.jobs
     WHERE status IN ('done', 'failed', 'cancelled')
       AND finished_at < now() - make_interval(secs => %(retention)s::float8)
     ORDER BY finished_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: queue_gauges
-- Jobs per queue and status, and per queue the age in seconds of the oldest
-- queued job whose run_at has come; for the pgfence_queue_* gauges.
SELECT queue, status, count(*)::bigint AS jobs,
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE status = 'queued' AND run_at <= now())), 0)::float8 AS oldest_age
  FROM pgfence.jobs
 GROUP BY queue, status;

-- name: failed_jobs
-- The newest failed jobs first, with their errors, optionally of one queue
-- and one kind; read from jobs_failed_idx, which holds failed jobs alone.
SELECT id, queue, kind, attempt, attempt - putbacks AS spent, max_attempts, reclaims,
       created_at, finished_at, last_error, last_traceback
  FROM pgfence.jobs
 WHERE status = 'failed'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
 ORDER BY finished_at DESC NULLS LAST, id DESC
 LIMIT %(limit)s;
