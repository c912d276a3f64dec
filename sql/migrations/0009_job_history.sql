-- A hot table of live jobs, and a history partitioned by day.
--
-- pgfence.jobs kept every finished job for the whole retention (7 days by
-- default), about 620 bytes each with its indexes, so claims, renewals and
-- vacuum worked on a table whose size followed the retention, not the
-- queue; and retention was a DELETE as costly as the completion itself.
-- From here on pgfence.jobs holds queued and running jobs alone: every
-- statement that finishes a job (completion, final failure, a claim's
-- verdict, cancel) deletes it from pgfence.jobs, fenced by (id, attempt) as
-- before, and inserts it into pgfence.job_history in the same statement.
-- History is partitioned by RANGE on finished_at, one partition a day (UTC),
-- so retention drops whole partitions (supervisor/worker/retention.py).
--
-- History keeps only what a finished job needs: no lease columns.  Columns
-- are ordered widest first, so that no padding sits between them.  A
-- primary key of a partitioned table must contain the partition key, so the
-- index by id is not unique: ids come from pgfence.jobs' identity, and a job
-- is in history at most once because only the statement that deletes it
-- from pgfence.jobs inserts it (and retry deletes it again before it
-- returns to pgfence.jobs).  pgfence's statements give every column; the
-- defaults (the id from pgfence.jobs' sequence) serve an import by hand, and
-- cost a row nothing.
CREATE TABLE pgfence.job_history (
    id             bigint      NOT NULL DEFAULT nextval(pg_get_serial_sequence('pgfence.jobs', 'id')::regclass),
    finished_at    timestamptz NOT NULL DEFAULT now(),
    created_at     timestamptz NOT NULL DEFAULT now(),
    run_at         timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    attempt        integer     NOT NULL DEFAULT 0,
    max_attempts   integer     NOT NULL DEFAULT 5,
    reclaims       integer     NOT NULL DEFAULT 0,
    max_reclaims   integer     NOT NULL DEFAULT 3,
    priority       integer     NOT NULL DEFAULT 0,
    putbacks       integer     NOT NULL DEFAULT 0,
    status         text        NOT NULL,
    queue          text        NOT NULL DEFAULT 'default',
    kind           text        NOT NULL,
    dedupe_key     text,
    payload        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    last_error     text,
    last_traceback text,
    CONSTRAINT job_history_status_check CHECK (status IN ('done', 'failed', 'cancelled'))
) PARTITION BY RANGE (finished_at);

-- Look-ups by id (status of one job, retry, a renewal's verdict): one
-- descent per partition.
CREATE INDEX job_history_id_idx ON pgfence.job_history (id);

-- `pgfence failed`: the newest failed jobs first (as jobs_failed_idx was).
CREATE INDEX job_history_failed_idx ON pgfence.job_history (finished_at DESC, id DESC)
    WHERE status = 'failed';

-- The safety net: a completion never fails for want of a partition.  Rows
-- that land here (no maintenance ran for days) stay until retention deletes
-- them in keyset batches, as it deleted finished jobs before.
CREATE TABLE pgfence.job_history_default PARTITION OF pgfence.job_history DEFAULT;

-- Creates the partition of one day (UTC) unless it exists; true when it
-- created it.  The table is created alone and then attached, which locks
-- pgfence.job_history only in SHARE UPDATE EXCLUSIVE mode: completions go
-- on inserting meanwhile.  (CREATE TABLE ... PARTITION OF would lock it
-- ACCESS EXCLUSIVE.)  When the default partition already holds rows of that
-- day, the attach is refused (check_violation): the day stays in the
-- default partition, with a warning, and nothing else fails.
CREATE FUNCTION pgfence.history_partition_create(p_day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'job_history_' || to_char(p_day, 'YYYYMMDD');
    v_from timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(format('pgfence.%I', v_name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    BEGIN
        EXECUTE format('CREATE TABLE pgfence.%I (LIKE pgfence.job_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       v_name);
        EXECUTE format('ALTER TABLE pgfence.job_history ATTACH PARTITION pgfence.%I FOR VALUES FROM (%L) TO (%L)',
                       v_name, v_from, v_from + interval '1 day');
    EXCEPTION WHEN check_violation THEN
        RAISE WARNING 'pgfence: the default history partition holds jobs finished on %; they stay there', p_day;
        RETURN false;
    END;
    RETURN true;
END;
$$;

-- The partitions of today through p_ahead days ahead (UTC); how many it
-- created.  Cheap when they all exist: a catalog look-up per day, no lock.
CREATE FUNCTION pgfence.history_partitions_ahead(p_ahead integer DEFAULT 3) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE pgfence.history_partition_create(d::date))::integer
      FROM generate_series((now() AT TIME ZONE 'UTC')::date,
                           (now() AT TIME ZONE 'UTC')::date + p_ahead, interval '1 day') AS d;
$$;

-- Retention's two steps for one day's table (job_history_YYYYMMDD): with
-- p_drop false, detach it from pgfence.job_history if it is attached; with
-- p_drop true, drop it if it is detached (never a partition still
-- attached).  True when the step was done.
--
-- DETACH PARTITION CONCURRENTLY is not allowed while a default partition
-- exists, so the detach is the plain one: it takes an ACCESS EXCLUSIVE lock
-- on pgfence.job_history for a catalog change only, and its caller sets a
-- lock_timeout so that it never waits long in front of completions.  The
-- drop is a second transaction, so that removing the files happens without
-- the parent's lock.
CREATE FUNCTION pgfence.history_partition_remove(p_name text, p_drop boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_name !~ '^job_history_[0-9]{8}$' OR NOT EXISTS (
           SELECT 1 FROM pg_class c
            WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relname = p_name AND c.relkind = 'r'
              AND c.relispartition = NOT p_drop) THEN
        RETURN false;
    END IF;
    IF p_drop THEN
        EXECUTE format('DROP TABLE pgfence.%I', p_name);
    ELSE
        EXECUTE format('ALTER TABLE pgfence.job_history DETACH PARTITION pgfence.%I', p_name);
    END IF;
    RETURN true;
END;
$$;

-- Moving an existing database's finished jobs.  Each day of the last 31
-- that holds finished jobs gets its partition (older days go to the default
-- partition, which retention empties in batches: a database kept for years
-- must not get a thousand partitions), and so do today and 3 days ahead.
SELECT pgfence.history_partition_create(d)
  FROM (SELECT DISTINCT (finished_at AT TIME ZONE 'UTC')::date AS d
          FROM pgfence.jobs
         WHERE status IN ('done', 'failed', 'cancelled')
           AND finished_at >= now() - interval '31 days') days;
SELECT pgfence.history_partitions_ahead(3);

INSERT INTO pgfence.job_history
SELECT id, coalesce(finished_at, now()), created_at, run_at, started_at, attempt, max_attempts, reclaims,
       max_reclaims, priority, putbacks, status, queue, kind, dedupe_key, payload, last_error, last_traceback
  FROM pgfence.jobs
 WHERE status IN ('done', 'failed', 'cancelled');

DELETE FROM pgfence.jobs WHERE status IN ('done', 'failed', 'cancelled');

-- Finished jobs no longer live here: their indexes go, and the table says
-- so, which turns any statement that would leave a finished job behind into
-- an error instead of a quiet return of the old growth.
DROP INDEX pgfence.jobs_finished_idx;
DROP INDEX pgfence.jobs_failed_idx;
ALTER TABLE pgfence.jobs ADD CONSTRAINT jobs_live_check CHECK (status IN ('queued', 'running'));

-- Every job, live or finished, with the columns of pgfence.jobs (NULL where
-- history keeps none).  Reads by id or status go through it.
CREATE VIEW pgfence.all_jobs AS
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       locked_by, lease_until, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback
  FROM pgfence.jobs
UNION ALL
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       NULL::text, NULL::timestamptz, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback
  FROM pgfence.job_history;

-- complete_fenced (0004), moving the job to history as every completion does.
CREATE OR REPLACE FUNCTION pgfence.complete_fenced(p_id bigint, p_attempt integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        DELETE FROM pgfence.jobs
         WHERE id = p_id AND attempt = p_attempt AND status = 'running'
        RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
                  priority, putbacks, 'done', queue, kind, dedupe_key, payload, last_error, last_traceback)
    INSERT INTO pgfence.job_history SELECT * FROM moved;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: job % attempt % no longer owns the job', p_id, p_attempt
            USING ERRCODE = 'PF001',
                  HINT = 'another attempt claimed it, or it was cancelled; its writes were rolled back';
    END IF;
END;
$$;

-- The jobs a claim's verdict fails (no attempts left, or quarantined), with
-- their new reclaim counts and verdicts, moved to history; the history rows.
-- A function, so that the claim's own text names no history table: a
-- statement that names pgfence.job_history locks it when it starts, and a
-- claim must go on while retention detaches a partition (which holds that
-- table's ACCESS EXCLUSIVE lock for a moment).  With no verdict, the insert
-- below is never run and the claim takes no lock on history at all.
CREATE FUNCTION pgfence.fail_claimed(p_ids bigint[], p_reclaims integer[], p_verdicts text[])
RETURNS SETOF pgfence.job_history
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH moved AS (
        DELETE FROM pgfence.jobs j
         USING unnest(p_ids, p_reclaims, p_verdicts) AS v(id, reclaims, verdict)
         WHERE j.id = v.id
        RETURNING j.id, now(), j.created_at, j.run_at, j.started_at, j.attempt, j.max_attempts, v.reclaims,
                  j.max_reclaims, j.priority, j.putbacks, 'failed'::text, j.queue, j.kind, j.dedupe_key,
                  j.payload, v.verdict, j.last_traceback)
    INSERT INTO pgfence.job_history SELECT * FROM moved RETURNING *;
END;
$$;
