-- What operators need to see and act on: paused queues, the supervisors
-- that are up, the attempts of a job that did not simply succeed, and the
-- worker that ran each finished job.

-- A paused queue's jobs are not claimed; jobs already running finish.  The
-- claim statement does not change: each worker leaves the paused queues out
-- of the queue list it passes to it, and reads this table again when
-- pgfence_pauses is notified (pause and resume do) and whenever it idles.
CREATE TABLE pgfence.queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text
);

-- One row per running supervisor (`pgfence run`), written by its heartbeat
-- manager every few seconds and deleted when it stops cleanly.  A row whose
-- last_seen is old is a supervisor that died: readers take as up only those
-- seen within the last 30 seconds.  children: [{"number", "pid", "jobs":
-- [{"id", "kind", "queue", "attempt"}]}].
CREATE TABLE pgfence.supervisors (
    instance   text        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    workers    integer     NOT NULL,
    version    text        NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    children   jsonb       NOT NULL DEFAULT '[]'
);

-- The attempts that did not simply succeed, one row each, written in the
-- statement (or, for a fence refusal, right after the transaction) that
-- ended them: an error, a lease lost and found expired by a reclaim, a
-- completion the fence refused, a release (shutdown, a dead worker), a
-- cancel while running, a timeout.  An attempt that succeeded writes
-- nothing here: the job's own row (its history row's worker, started_at
-- and finished_at) tells it, so the happy path costs no extra write.  An
-- attempt may end in two ways at once (cancelled, then its completion
-- refused), hence the outcome in the key.
CREATE TABLE pgfence.job_attempts (
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker     text,
    started_at timestamptz,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    outcome    text        NOT NULL,
    detail     text,
    PRIMARY KEY (job_id, attempt, outcome),
    CONSTRAINT job_attempts_outcome_check CHECK (outcome IN ('error', 'lease_lost', 'fence_rejected', 'released',
                                                             'cancelled', 'timeout'))
);

-- Retention deletes the rows older than the history's retention, oldest
-- first, in batches.
CREATE INDEX job_attempts_ended_idx ON pgfence.job_attempts (ended_at);

-- The worker that ran a finished job's last attempt (pgfence.jobs'
-- locked_by when the job left it).  Added last, so every statement that
-- moves a job to history names it last in its column list.
ALTER TABLE pgfence.job_history ADD COLUMN worker text;

-- all_jobs (0009) with the worker: locked_by for live jobs, the history
-- row's worker for finished ones.
CREATE OR REPLACE VIEW pgfence.all_jobs AS
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       locked_by, lease_until, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, locked_by AS worker
  FROM pgfence.jobs
UNION ALL
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       NULL::text, NULL::timestamptz, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, worker
  FROM pgfence.job_history;

-- complete_fenced (0009), keeping the worker.
CREATE OR REPLACE FUNCTION pgfence.complete_fenced(p_id bigint, p_attempt integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        DELETE FROM pgfence.jobs
         WHERE id = p_id AND attempt = p_attempt AND status = 'running'
        RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
                  priority, putbacks, 'done', queue, kind, dedupe_key, payload, last_error, last_traceback,
                  locked_by)
    INSERT INTO pgfence.job_history SELECT * FROM moved;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: job % attempt % no longer owns the job', p_id, p_attempt
            USING ERRCODE = 'PF001',
                  HINT = 'another attempt claimed it, or it was cancelled; its writes were rolled back';
    END IF;
END;
$$;

-- fail_claimed (0009), keeping the worker.  The claim now calls
-- settle_reclaims below; this one stays for a claim statement of an older
-- pgfence still running during an upgrade.
CREATE OR REPLACE FUNCTION pgfence.fail_claimed(p_ids bigint[], p_reclaims integer[], p_verdicts text[])
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
                  j.payload, v.verdict, j.last_traceback, j.locked_by)
    INSERT INTO pgfence.job_history SELECT * FROM moved RETURNING *;
END;
$$;

-- What a claim does with the reclaims it took (running jobs whose lease
-- expired) and the jobs its verdict fails: p_decided holds one object per
-- such job, {"id", "prev_status", "reclaims", "verdict"} and, for a
-- reclaim, its lost attempt {"attempt", "worker", "started_at",
-- "lease_until"} (as read before the claim updated the row).  Each lost
-- attempt is recorded (outcome lease_lost, ended when its lease ran out);
-- the jobs with a verdict move to history, as fail_claimed does; returns
-- their history rows.  A function, for the reason given at fail_claimed in
-- 0009 (the claim's text names neither history nor attempts, so it locks
-- neither), and so that a claim with neither (nearly every one: p_decided
-- is NULL) runs no insert and pays one function call, as before.
CREATE FUNCTION pgfence.settle_reclaims(p_decided jsonb)
RETURNS SETOF pgfence.job_history
LANGUAGE plpgsql AS $$
BEGIN
    IF p_decided IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, ended_at, outcome, detail)
    SELECT d.id, d.attempt, d.worker, d.started_at, coalesce(d.lease_until, now()), 'lease_lost',
           'lease expired: its worker stopped renewing it, and the job was claimed again'
      FROM jsonb_to_recordset(p_decided) AS d(id bigint, prev_status text, attempt integer, worker text,
                                              started_at timestamptz, lease_until timestamptz)
     WHERE d.prev_status = 'running'
    ON CONFLICT DO NOTHING;
    RETURN QUERY
    WITH moved AS (
        DELETE FROM pgfence.jobs j
         USING jsonb_to_recordset(p_decided) AS v(id bigint, reclaims integer, verdict text)
         WHERE j.id = v.id AND v.verdict IS NOT NULL
        RETURNING j.id, now(), j.created_at, j.run_at, j.started_at, j.attempt, j.max_attempts, v.reclaims,
                  j.max_reclaims, j.priority, j.putbacks, 'failed'::text, j.queue, j.kind, j.dedupe_key,
                  j.payload, v.verdict, j.last_traceback, j.locked_by)
    INSERT INTO pgfence.job_history SELECT * FROM moved RETURNING *;
END;
$$;

-- The dashboard's overview counts the jobs finished in the last minutes.
-- History is written in finished_at order, so a BRIN index (a few pages for
-- a day of millions of rows, next to nothing per insert) lets that count
-- read the last block ranges of today's partition instead of all of it.
CREATE INDEX job_history_finished_brin ON pgfence.job_history USING brin (finished_at) WITH (pages_per_range = 32);
