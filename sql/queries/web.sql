-- name: web_jobs_page
-- One page of the dashboard's job list: the newest jobs first, live and
-- finished alike (pgfence.all_jobs), each filter applied when given (NULL:
-- no filter), keyset on id (%(before)s: the smallest id of the page before;
-- NULL: the first page).  ORDER BY id DESC over the view's UNION ALL is a
-- Merge Append of backward scans of jobs_pkey and of each history
-- partition's id index, cut by the Limit: a page reads about its own rows
-- whatever the history kept, as long as the filters match often (a filter
-- that matches one job in a million walks the index until it found a
-- page).  A status filter reads one side alone: jobs_live_check and
-- job_history_status_check exclude the other (constraint_exclusion's
-- default applies to UNION ALL).  The error filter is a case-insensitive
-- substring of last_error, compared as text (no pattern characters).
SELECT id, queue, kind, status, attempt, max_attempts, priority, run_at, created_at, started_at, finished_at,
       dedupe_key, last_error
  FROM pgfence.all_jobs
 WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
   AND (%(upto)s::bigint IS NULL OR id <= %(upto)s::bigint)
   AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(dedupe_key)s::text IS NULL OR dedupe_key = %(dedupe_key)s::text)
   AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: web_jobs_count
-- How many jobs match the filters of web_jobs_page (the number a bulk
-- action's confirmation shows), and the largest id among them: the bulk
-- action acts on jobs up to that id, so that jobs enqueued after the
-- operator read the count are left alone.  With %(upto)s, only the jobs up
-- to that id (the count a bulk action's runner starts with).  A full
-- count: it reads every matching row, which an operator's confirmation may
-- afford.
SELECT count(*)::bigint, max(id)
  FROM pgfence.all_jobs
 WHERE (%(upto)s::bigint IS NULL OR id <= %(upto)s::bigint)
   AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(dedupe_key)s::text IS NULL OR dedupe_key = %(dedupe_key)s::text)
   AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]));

-- name: web_job
-- One job, live or finished, with every column the job page shows; the
-- worker is the live job's owner (locked_by) or the one that ran its last
-- attempt (history's worker).
SELECT id, queue, kind, status, payload, attempt, max_attempts, reclaims, max_reclaims, priority, putbacks,
       run_at, created_at, started_at, finished_at, lease_until, worker, dedupe_key, last_error, last_traceback,
       result, now() AS now, concurrency_key, held_back
  FROM pgfence.all_jobs
 WHERE id = %(id)s::bigint
 LIMIT 1;

-- name: web_job_attempts
-- The attempts of one job that did not simply succeed (errors, leases lost,
-- completions the fence refused, releases, cancels, timeouts), in order.
SELECT attempt, worker, started_at, ended_at, outcome, detail, traceback
  FROM pgfence.job_attempts
 WHERE job_id = %(id)s::bigint
 ORDER BY attempt, ended_at, outcome;

-- name: web_delete_ids
-- Delete the jobs of %(ids)s that are queued (from pgfence.jobs) or
-- finished (from history), with their attempt rows; never a running job.
-- The queued rows are locked in id order, as every statement that locks
-- many jobs; a job a worker claims meanwhile is running when the lock is
-- had, and is left alone.  The ids deleted.
WITH live AS (
    DELETE FROM pgfence.jobs
     WHERE id IN (SELECT id FROM pgfence.jobs
                   WHERE id = ANY(%(ids)s::bigint[]) AND status = 'queued'
                   ORDER BY id
                     FOR UPDATE)
       AND status = 'queued'
    RETURNING id
), finished AS (
    DELETE FROM pgfence.job_history
     WHERE id = ANY(%(ids)s::bigint[])
    RETURNING id
), gone AS (
    SELECT id FROM live UNION ALL SELECT id FROM finished
), attempts AS (
    DELETE FROM pgfence.job_attempts
     WHERE job_id IN (SELECT id FROM gone)
)
SELECT id FROM gone ORDER BY id;

-- name: web_recent
-- Per queue, the jobs that finished done and failed in the last
-- %(seconds)s seconds: only the partitions of those days are read.
SELECT queue,
       count(*) FILTER (WHERE status = 'done')::bigint AS done,
       count(*) FILTER (WHERE status = 'failed')::bigint AS failed
  FROM pgfence.job_history
 WHERE finished_at > now() - make_interval(secs => %(seconds)s::float8)
 GROUP BY queue
 ORDER BY queue;

-- name: web_has_schedules
-- Whether any periodic schedule exists (the navigation links the page then).
SELECT EXISTS (SELECT 1 FROM pgfence.schedules);

-- name: web_session
-- Once per connection of the dashboard: no statement runs longer than
-- %(ms)s milliseconds (a count over a large history, a bulk batch stuck
-- behind a lock), so that a page answers or fails instead of hanging.
SELECT set_config('statement_timeout', %(ms)s, false);
