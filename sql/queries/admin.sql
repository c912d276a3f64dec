-- name: status_counts
-- Jobs per queue and status: the live jobs of pgfence.jobs counted exactly,
-- and the finished ones of pgfence.job_history from a sample of
-- %(percent)s percent of its pages, scaled up (SYSTEM at 100 reads every
-- page: an exact count).  The caller chooses the percentage from
-- history_estimate, so that a history of a hundred million rows costs a
-- status call about what a small one does.  The two tables hold different
-- statuses, so no pair (queue, status) comes twice.
SELECT queue, status, count(*)::bigint AS jobs
  FROM pgfence.jobs
 GROUP BY queue, status
UNION ALL
SELECT queue, status, round(count(*) * 100.0 / %(percent)s::float8)::bigint
  FROM pgfence.job_history TABLESAMPLE SYSTEM (%(percent)s::float8)
 GROUP BY queue, status
 ORDER BY queue, status;

-- name: history_estimate
-- The number of rows in pgfence.job_history as the planner would estimate
-- it, from the catalog alone: each partition's rows per page (reltuples /
-- relpages, as of its last VACUUM or ANALYZE) times its pages now, or, for
-- a partition never analyzed, its pages times 60 (a finished no-op job
-- takes about 130 bytes of heap).
SELECT coalesce(sum(CASE WHEN c.reltuples > 0 AND c.relpages > 0
                         THEN c.reltuples / c.relpages
                         ELSE 60 END
                    * (pg_relation_size(c.oid) / current_setting('block_size')::int)), 0)::float8
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'pgfence.job_history'::regclass;

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
-- those spent (attempt - putbacks: see put_back_unknown in jobs.sql).  Only
-- finished jobs are candidates, so they are read from pgfence.job_history;
-- a job put back leaves history and returns to pgfence.jobs with its own id
-- (OVERRIDING SYSTEM VALUE), so its idempotency key and any row that names
-- it stay valid.  Done jobs are left alone.  A job whose dedupe key a live
-- (queued or running) job of its kind holds is skipped, and so is every
-- candidate but the oldest of those sharing one key: putting it back would
-- break jobs_dedupe_idx and abort the whole statement.  One row per
-- candidate: requeued or not, and the id of the job that holds its key (the
-- live job, else the candidate requeued in its place).  Rows are locked in
-- id order, like every statement that locks many jobs.
WITH cand AS (
    SELECT id, kind, dedupe_key FROM pgfence.job_history
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
), moved AS (
    DELETE FROM pgfence.job_history h
     USING verdict v
     WHERE h.id = v.id AND v.live IS NULL AND (v.first IS NULL OR v.first = v.id)
       AND h.status IN ('failed', 'cancelled')
    RETURNING h.*
), requeued AS (
    INSERT INTO pgfence.jobs
           (id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority,
            run_at, dedupe_key, last_error, created_at, started_at, putbacks, last_traceback)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, kind, payload, 'queued', attempt, attempt - putbacks + %(extra_attempts)s, 0,
           max_reclaims, priority, now(), dedupe_key, last_error, created_at, started_at, putbacks,
           last_traceback
      FROM moved
    RETURNING id
)
SELECT v.id, r.id IS NOT NULL AS requeued, CASE WHEN r.id IS NULL THEN coalesce(v.live, v.first) END AS holder
  FROM verdict v LEFT JOIN requeued r ON r.id = v.id
 ORDER BY v.id;

-- name: cancel_ids
-- Cancel queued or running jobs: they leave pgfence.jobs for history as
-- cancelled.  A running job's owner learns it at its next renewal (reason
-- cancelled), and its completion finds no row it owns: the fence refuses it.
-- The attempt of each running job cancelled is recorded in
-- pgfence.job_attempts (outcome cancelled).
WITH moved AS (
    DELETE FROM pgfence.jobs
     WHERE id IN (SELECT id FROM pgfence.jobs
                   WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'running')
                   ORDER BY id
                     FOR UPDATE)
       AND status IN ('queued', 'running')
    RETURNING id, now() AS finished_at, created_at, run_at, started_at, attempt, max_attempts, reclaims,
              max_reclaims, priority, putbacks, 'cancelled' AS status, queue, kind, dedupe_key, payload,
              coalesce(last_error, 'cancelled by an operator') AS last_error, last_traceback,
              locked_by AS worker, status AS was
), archived AS (
    INSERT INTO pgfence.job_history
    SELECT id, finished_at, created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
           priority, putbacks, status, queue, kind, dedupe_key, payload, last_error, last_traceback, worker
      FROM moved
    RETURNING id
), noted AS (
    INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail)
    SELECT id, attempt, worker, started_at, 'cancelled', 'cancelled by an operator while running'
      FROM moved
     WHERE was = 'running'
    ON CONFLICT DO NOTHING
)
SELECT id FROM archived;

-- name: prune_batch
-- Delete up to %(batch)s finished jobs older than the retention from the
-- default partition of history (jobs that finished while their day had no
-- partition), oldest first.  Called in a loop until it deletes fewer than a
-- batch; the day partitions are dropped whole instead.
DELETE FROM pgfence.job_history_default
 WHERE ctid IN (
    SELECT ctid FROM pgfence.job_history_default
     WHERE finished_at < now() - make_interval(secs => %(retention)s::float8)
     ORDER BY finished_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: history_partitions_ahead
-- Create the history partitions of today through %(days)s days ahead (UTC)
-- that are missing; how many were created.  Cheap when none is missing.
SELECT pgfence.history_partitions_ahead(%(days)s);

-- name: history_partitions_expired
-- The day partitions of pgfence.job_history whose whole day ended before
-- now() - %(retention)s seconds, oldest first, and the tables of such days
-- that a detach left behind without their drop (a crash between the two).
-- The day is read from the name (job_history_YYYYMMDD), which
-- history_partition_create gives each partition for its day in UTC.
SELECT c.relname::text AS name, c.relispartition AS attached
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'pgfence' AND c.relkind = 'r' AND c.relname ~ '^job_history_[0-9]{8}$'
   AND (to_date(substr(c.relname, 13), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
       <= now() - make_interval(secs => %(retention)s::float8)
 ORDER BY c.relname;

-- name: history_lock_timeout
-- For the rest of this transaction, wait at most %(ms)s milliseconds for a
-- lock: a detach that cannot have pgfence.job_history at once gives up and
-- tries again at the next round, instead of queueing in front of the
-- completions that insert into it.
SELECT set_config('lock_timeout', %(ms)s, true);

-- name: history_partition_remove
-- Detach one expired day's partition (%(drop)s false), or drop its table
-- once detached (%(drop)s true); true when the step was done (see the
-- function in 0009).
SELECT pgfence.history_partition_remove(%(name)s, %(drop)s);

-- name: queue_gauges
-- Live jobs per queue and status, and per queue the age in seconds of the
-- oldest queued job whose run_at has come; for the pgfence_queue_* gauges.
-- Only pgfence.jobs is read, so a scrape costs what the queue holds,
-- whatever the history kept.
SELECT queue, status, count(*)::bigint AS jobs,
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE status = 'queued' AND run_at <= now())), 0)::float8 AS oldest_age
  FROM pgfence.jobs
 GROUP BY queue, status;

-- name: failed_jobs
-- The newest failed jobs first, with their errors, optionally of one queue
-- and one kind; read from job_history_failed_idx, which holds failed jobs
-- alone (the partitions are merged in index order).
SELECT id, queue, kind, attempt, attempt - putbacks AS spent, max_attempts, reclaims,
       created_at, finished_at, last_error, last_traceback
  FROM pgfence.job_history
 WHERE status = 'failed'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
 ORDER BY finished_at DESC, id DESC
 LIMIT %(limit)s;

-- name: maintenance_try_lock
-- Take the history maintenance lock for this transaction, if no other
-- process holds it: every worker runs the maintenance, and one at a time is
-- enough (the others find the work done, or do it at their next round).
SELECT pg_try_advisory_xact_lock(%(key)s);

-- name: prune_attempts
-- Delete up to %(batch)s rows of pgfence.job_attempts that ended more than
-- %(retention)s seconds ago, oldest first (job_attempts_ended_idx): attempt
-- rows follow the history's retention.  Called in a loop until it deletes
-- fewer than a batch.
DELETE FROM pgfence.job_attempts
 WHERE ctid IN (
    SELECT ctid FROM pgfence.job_attempts
     WHERE ended_at < now() - make_interval(secs => %(retention)s::float8)
     ORDER BY ended_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED);
