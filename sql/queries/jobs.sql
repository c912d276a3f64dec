-- name: claim
-- Claim up to %(batch)s jobs from %(queues)s: queued jobs whose run_at has
-- come and, when %(reclaim)s, running jobs whose lease has expired
-- (reclaims), highest priority first, then oldest run_at, then id.  Every
-- claim bumps attempt, the fencing token.  A reclaim on the final attempt,
-- or past max_reclaims, turns the job failed instead of running it again,
-- and moves it to pgfence.job_history in the same statement; the lost
-- attempt of every reclaim is recorded in pgfence.job_attempts
-- (pgfence.settle_reclaims, migration 0012).
-- prev_status tells reclaims apart.  The attempts spent are attempt -
-- putbacks: a put-back (put_back_unknown) is a claim that ran nothing.
-- The verdict is computed from the row versions that FOR UPDATE locked, never
-- from an older snapshot of the same rows.  The payload comes back as text:
-- the worker decodes it only if the handler reads it.
-- Each queue is read on its own, with queue = one value: an index then
-- yields its rows already in (priority DESC, run_at, id) order and the scan
-- stops after the batch, so a claim costs the same with ten jobs queued or a
-- million.  (queue = ANY(array) makes PostgreSQL read every live row of the
-- queues and sort them, for each claim.)  Queued jobs come from an index of
-- queued jobs alone (not held back by a concurrency limit: migration 0017),
-- so running and held jobs cost the claim nothing; running jobs
-- are read, for expired leases, only when the worker asks (%(reclaim)s,
-- about once a second): with it false PostgreSQL skips that scan.  Each
-- queue's heads are then merged.  %(kinds)s, when not NULL, limits the
-- claim to those kinds, and %(not_kinds)s to the others: a worker that runs
-- both def and async def handlers claims for its event loop's free slots
-- only async kinds, and for its threads' only the other kinds (unknown
-- kinds included, which a thread puts back).
WITH candidates AS (
    SELECT c.*
      FROM unnest(%(queues)s::text[]) AS wanted(queue)
     CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT id, status AS prev_status, attempt - putbacks AS spent, max_attempts,
                   reclaims AS new_reclaims, max_reclaims, priority, run_at, NULL::jsonb AS lost
              FROM pgfence.jobs
             WHERE queue = wanted.queue AND status = 'queued' AND held_back IS NULL AND run_at <= now()
               AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
               AND (%(not_kinds)s::text[] IS NULL OR kind <> ALL(%(not_kinds)s::text[]))
             ORDER BY priority DESC, run_at, id
             LIMIT %(batch)s
               FOR UPDATE SKIP LOCKED) AS queued
        UNION ALL
        SELECT * FROM (
            SELECT id, status, attempt - putbacks, max_attempts,
                   reclaims + 1, max_reclaims, priority, run_at,
                   jsonb_build_object('attempt', attempt, 'worker', locked_by, 'started_at', started_at,
                                      'lease_until', lease_until)
              FROM pgfence.jobs
             WHERE %(reclaim)s::boolean
               AND queue = wanted.queue AND status = 'running' AND lease_until < now()
               AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
               AND (%(not_kinds)s::text[] IS NULL OR kind <> ALL(%(not_kinds)s::text[]))
             ORDER BY priority DESC, run_at, id
             LIMIT %(batch)s
               FOR UPDATE SKIP LOCKED) AS expired
     ) c
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT %(batch)s
), decided AS (
    SELECT id, prev_status, new_reclaims, lost,
           CASE
               WHEN spent >= max_attempts THEN
                   CASE WHEN prev_status = 'running'
                        THEN format('lease expired on the final attempt (%%s of %%s)', spent, max_attempts)
                        ELSE format('no attempts left (%%s of %%s used)', spent, max_attempts)
                   END
               WHEN new_reclaims > max_reclaims THEN
                   format('quarantined: lost its worker %%s times (max_reclaims %%s)', new_reclaims, max_reclaims)
           END AS verdict
      FROM candidates
), failed AS (
    -- A reclaim's lost attempt is recorded in pgfence.job_attempts, and a
    -- verdict ends the job: it leaves for history in this statement.  Both
    -- through a function that touches those tables only when there are
    -- reclaims or verdicts, given those rows as one jsonb (NULL without
    -- any): one subquery, which costs the claim's planning less than the
    -- arrays it replaces.  A reclaim's lost attempt (its number, worker,
    -- start and lease end) is read in the reclaim branch above, from the
    -- row version that FOR UPDATE locked, before this statement updates it.
    SELECT f.*, d.prev_status
      FROM pgfence.settle_reclaims(
               (SELECT jsonb_agg(jsonb_build_object('id', id, 'prev_status', prev_status, 'reclaims', new_reclaims,
                                                    'verdict', verdict) || coalesce(lost, '{}') ORDER BY id)
                  FROM decided WHERE prev_status = 'running' OR verdict IS NOT NULL)) AS f
      JOIN decided d ON d.id = f.id
), claimed AS (
    UPDATE pgfence.jobs j
       SET status      = 'running',
           attempt     = j.attempt + 1,
           reclaims    = d.new_reclaims,
           locked_by   = %(worker)s,
           lease_until = now() + make_interval(secs => coalesce(
                             (SELECT l.lease FROM unnest(%(lease_kinds)s::text[], %(lease_secs)s::float8[]) AS l(kind, lease)
                               WHERE l.kind = j.kind LIMIT 1),
                             %(lease)s::float8)),
           started_at  = now(),
           finished_at = NULL
      FROM decided d
     WHERE j.id = d.id AND d.verdict IS NULL
    RETURNING j.id, j.queue, j.kind, j.payload::text AS payload, j.status, j.attempt, j.max_attempts,
              j.reclaims, j.max_reclaims, j.priority, j.dedupe_key, j.created_at, j.run_at, j.last_error,
              d.prev_status
)
SELECT * FROM claimed
UNION ALL
SELECT id, queue, kind, payload::text, status, attempt, max_attempts, reclaims, max_reclaims, priority,
       dedupe_key, created_at, run_at, last_error, prev_status
  FROM failed;

-- name: complete
-- Fenced completion: moves the job to history as done only while this
-- attempt still owns it.  Zero rows means the lease was lost and the caller
-- must roll back.  The history row's columns come in the table's order,
-- the handler's result (JSON text, or NULL) last.
WITH moved AS (
    DELETE FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'done', queue, kind, dedupe_key, payload, last_error, last_traceback,
              locked_by
)
INSERT INTO pgfence.job_history SELECT *, %(result)s::jsonb FROM moved
RETURNING id;

-- name: store_result
-- The result of a job whose handler's fenced block completed it before the
-- handler returned: written on the history row that attempt's completion
-- made, and on no other (a later attempt's row has another attempt).
UPDATE pgfence.job_history
   SET result = %(result)s::jsonb
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'done';

-- name: complete_or_raise
-- The fenced completion for a pipelined block (Job.fenced(pipeline=True)):
-- raises SQLSTATE PF001 when this attempt no longer owns the job, which
-- aborts the transaction before the COMMIT queued behind it.
SELECT pgfence.complete_fenced(%(id)s, %(attempt)s);

-- name: complete_many
-- Fenced completion of many jobs in one statement (handlers that wrote
-- nothing of their own), moving them to history; returns the ids that were
-- still owned.  The rows
-- are locked in id order first, like every statement that locks many jobs
-- (see renew in heartbeat.sql): no deadlock with the heartbeat's renewal.
-- The fence is in the lock: only rows of this attempt, still running, are
-- locked (a row changed meanwhile is checked again as it is locked), and
-- nothing changes a locked row before this statement does.  The delete
-- then finds them by id alone: with status = 'running' there too, a
-- generic plan made while the statistics counted few running jobs (right
-- after a bulk enqueue) scanned the running jobs once per job completed,
-- a cost that grew with the square of the batch.
-- %(results)s holds each job's result (JSON text, or NULL), by position.
WITH owned AS (
    SELECT j.id, f.result
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::text[]) AS f(id, attempt, result)
      JOIN pgfence.jobs j ON j.id = f.id AND j.attempt = f.attempt AND j.status = 'running'
     ORDER BY j.id
       FOR UPDATE OF j
), moved AS (
    DELETE FROM pgfence.jobs j
     USING owned o
     WHERE j.id = o.id
    RETURNING j.id, now(), j.created_at, j.run_at, j.started_at, j.attempt, j.max_attempts, j.reclaims,
              j.max_reclaims, j.priority, j.putbacks, 'done', j.queue, j.kind, j.dedupe_key, j.payload,
              j.last_error, j.last_traceback, j.locked_by, o.result::jsonb
)
INSERT INTO pgfence.job_history SELECT * FROM moved
RETURNING id;

-- name: fail_or_retry
-- Fenced error report: back to queued with run_at pushed by the backoff, or,
-- once the attempts are spent (attempt - putbacks: put-backs spent none) or
-- with %(final)s, failed and moved to history.  The two branches exclude
-- each other by the same test, so exactly one of them takes an owned job;
-- a stale worker's report matches neither.  last_traceback is the error's
-- traceback, or NULL when it has none.  The attempt is recorded in
-- pgfence.job_attempts (%(outcome)s: error or timeout, with the error as
-- its detail and its traceback) when either branch took the job; its worker and start come
-- from the row as this statement's snapshot saw it (the update clears
-- locked_by, and its RETURNING gives the new values only).
WITH mine AS (
    SELECT locked_by, started_at
      FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
), moved AS (
    DELETE FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
       AND (attempt - putbacks >= max_attempts OR %(final)s)
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'failed', queue, kind, dedupe_key, payload, %(error)s::text, %(traceback)s::text,
              locked_by
), archived AS (
    INSERT INTO pgfence.job_history SELECT * FROM moved
    RETURNING status, queue, kind, attempt - putbacks AS spent, max_attempts
), retried AS (
    UPDATE pgfence.jobs
       SET status         = 'queued',
           run_at         = now() + make_interval(secs => %(backoff)s::float8),
           finished_at    = NULL,
           last_error     = %(error)s,
           last_traceback = %(traceback)s,
           locked_by      = NULL,
           lease_until    = NULL
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
       AND NOT (attempt - putbacks >= max_attempts OR %(final)s)
    RETURNING status, queue, kind, attempt - putbacks AS spent, max_attempts
), noted AS (
    INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail, traceback)
    SELECT %(id)s, %(attempt)s, m.locked_by, m.started_at, %(outcome)s, %(error)s, %(traceback)s::text
      FROM mine m
     WHERE EXISTS (SELECT 1 FROM archived) OR EXISTS (SELECT 1 FROM retried)
    ON CONFLICT DO NOTHING
)
SELECT * FROM archived
UNION ALL
SELECT * FROM retried;

-- name: put_back_unknown
-- Fenced put-back of a job whose kind this worker does not know (a rolling
-- deploy: a worker that knows it may not be up yet).  The job goes back to
-- queued with run_at %(delay)s seconds from now and putbacks + 1, so the
-- attempt this claim took is not counted as spent; attempt itself stays, as
-- the fencing token never goes back.  Once the job is %(give_up)s seconds
-- old (from created_at, by the database clock) it is failed instead, with
-- %(error)s, and moved to history.  Returns the new status; no row when this
-- attempt no longer owns the job.
WITH moved AS (
    DELETE FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
       AND created_at <= now() - make_interval(secs => %(give_up)s::float8)
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'failed', queue, kind, dedupe_key, payload, %(error)s::text, NULL::text,
              locked_by
), archived AS (
    INSERT INTO pgfence.job_history SELECT * FROM moved
    RETURNING status
), put_back AS (
    UPDATE pgfence.jobs
       SET status      = 'queued',
           putbacks    = putbacks + 1,
           run_at      = now() + make_interval(secs => %(delay)s::float8),
           locked_by   = NULL,
           lease_until = NULL
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
       AND NOT created_at <= now() - make_interval(secs => %(give_up)s::float8)
    RETURNING status
)
SELECT status FROM archived
UNION ALL
SELECT status FROM put_back;

-- name: next_run_at
-- Seconds until the earliest run_at still to come among the queued jobs of
-- %(queues)s (NULL if none): how long an idle worker may sleep before a
-- delayed job or a retry becomes due.  jobs_queued_idx is ordered by
-- priority first, so min(run_at) would read every queued job of a queue.
-- Instead the distinct priorities of each queue are walked down the index
-- (one descent each, a "skip scan"), and for each priority the first run_at
-- after now() is one more descent: a few index pages per priority, however
-- many jobs wait.  (A separate index on (queue, run_at) would make this one
-- descent, but would cost every enqueue, claim and retry an index entry, to
-- speed up a look-up made only by a worker that found nothing to do.)
WITH RECURSIVE priorities AS (
    SELECT wanted.queue,
           (SELECT priority FROM pgfence.jobs
             WHERE queue = wanted.queue AND status = 'queued' AND held_back IS NULL
             ORDER BY priority DESC LIMIT 1) AS priority
      FROM unnest(%(queues)s::text[]) AS wanted(queue)
    UNION ALL
    SELECT p.queue,
           (SELECT priority FROM pgfence.jobs
             WHERE queue = p.queue AND status = 'queued' AND held_back IS NULL AND priority < p.priority
             ORDER BY priority DESC LIMIT 1)
      FROM priorities p
     WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM least(
           min((SELECT run_at FROM pgfence.jobs
                 WHERE queue = p.queue AND status = 'queued' AND held_back IS NULL AND priority = p.priority
                   AND run_at > now()
                 ORDER BY priority DESC, run_at LIMIT 1)),
           -- A job held back by a concurrency limit until its run_at
           -- (migration 0017), of any queue: the wake admits it
           -- (admit_due), and the admission notifies its queue.
           (SELECT min(run_at) FROM pgfence.jobs WHERE held_back = 'scheduled')) - now())::float8
  FROM priorities p
 WHERE p.priority IS NOT NULL;

-- name: next_lease_end
-- Seconds until the earliest lease still to run out among the running jobs
-- of %(queues)s (NULL if none): an idle worker wakes then, so that a job
-- whose worker died (a host gone, a SIGKILLed `pgfence work`) is reclaimed
-- about when its lease ends, not at the next poll; an expiring lease sends
-- no NOTIFY.  Read through jobs_running_idx, the index of running jobs
-- alone, one queue at a time: an idle worker found nothing to claim, so the
-- running jobs of its queues are the few that the workers hold, and it reads
-- nothing of the queued or finished ones.  lease_until is in no index on
-- purpose: a renewal, which only moves lease_until, stays a HOT update.
SELECT extract(epoch FROM min(r.lease_until) - now())::float8
  FROM unnest(%(queues)s::text[]) AS wanted(queue)
 CROSS JOIN LATERAL (
    SELECT lease_until FROM pgfence.jobs
     WHERE queue = wanted.queue AND status = 'running' AND lease_until > now()) r;

-- name: release
-- Fenced release: hands a claimed job back to the queue at once, for a job
-- never started (shutdown) or one whose worker died (%(reclaim)s counts it
-- against the reclaim budget).  The attempt is recorded in
-- pgfence.job_attempts as released, %(detail)s saying why (its worker and
-- start as in fail_or_retry).
WITH mine AS (
    SELECT locked_by, started_at
      FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
), released AS (
    UPDATE pgfence.jobs
       SET status      = 'queued',
           locked_by   = NULL,
           lease_until = NULL,
           reclaims    = reclaims + CASE WHEN %(reclaim)s THEN 1 ELSE 0 END,
           last_error  = coalesce(%(reason)s, last_error)
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
    RETURNING id, queue, kind
), noted AS (
    INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail)
    SELECT %(id)s, %(attempt)s, m.locked_by, m.started_at, 'released', %(detail)s
      FROM mine m
     WHERE EXISTS (SELECT 1 FROM released)
    ON CONFLICT DO NOTHING
)
SELECT id, queue, kind FROM released;

-- name: note_fence_rejected
-- Record the attempts whose owner write the fence refused (outcome
-- fence_rejected): %(what)s (their completion, after its transaction was
-- rolled back; their error report; their put-back) of %(ids)s and
-- %(attempts)s, run by %(worker)s for %(ran)s seconds each.  The detail
-- says what had happened to the job: another attempt holds it, it went
-- back to the queue (released, retried), or it had ended (cancelled,
-- failed, done by another attempt).
INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail)
SELECT f.id, f.attempt, %(worker)s, now() - make_interval(secs => f.ran), 'fence_rejected',
       %(what)s || ' refused by the fence: ' || coalesce(
           (SELECT CASE WHEN j.attempt <> f.attempt THEN format('attempt %%s holds the job now', j.attempt)
                        ELSE 'the job went back to the queue meanwhile' END
              FROM pgfence.jobs j WHERE j.id = f.id),
           (SELECT format('the job was %%s meanwhile', h.status) FROM pgfence.job_history h
             WHERE h.id = f.id ORDER BY h.finished_at DESC LIMIT 1),
           'the job no longer exists')
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ran)s::float8[]) AS f(id, attempt, ran)
ON CONFLICT DO NOTHING;

-- name: complete_unfenced
-- UNSAFE, used only by `pgfence demo` to show what happens without the fence:
-- completes by id alone, as most queues do.  A job another attempt already
-- moved to history is marked done there again, and that counts as success,
-- as the old UPDATE by id did.
WITH moved AS (
    DELETE FROM pgfence.jobs
     WHERE id = %(id)s
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'done', queue, kind, dedupe_key, payload, last_error, last_traceback,
              locked_by
), archived AS (
    INSERT INTO pgfence.job_history SELECT * FROM moved
    RETURNING id
), again AS (
    UPDATE pgfence.job_history
       SET status = 'done'
     WHERE id = %(id)s AND NOT EXISTS (SELECT 1 FROM moved)
    RETURNING id
)
SELECT id FROM archived
UNION ALL
SELECT id FROM again;

-- name: owned_running
-- The running jobs a worker claimed, by its name: used when it died before
-- it could publish a claim, to release them with the (id, attempt) fence.
SELECT id, attempt
  FROM pgfence.jobs
 WHERE locked_by = %(owner)s AND status = 'running';

-- name: still_owned
-- Whether this attempt still owns the job (running, same attempt): asked
-- after a one-round-trip block failed without saying why (psycopg reports
-- "pipeline aborted" when the error of the statement that aborted it was
-- read elsewhere), to tell a fence refusal from any other failure.
SELECT EXISTS (SELECT 1 FROM pgfence.jobs
                WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running');

-- name: rate_limited
-- A handler's RateLimited (the service it calls answered 429): fenced as
-- put_back_unknown, the job goes back to queued with run_at %(delay)s
-- seconds from now and putbacks + 1, so no attempt is spent; a kind with a
-- rate limit (migration 0017) starts none of its jobs before then (its
-- rate's theoretical arrival time pushed past it, under the limits row's
-- lock).  The attempt is recorded in pgfence.job_attempts as released, with
-- %(detail)s.  Returns the job's id; no row when this attempt no longer
-- owns it.
WITH mine AS (
    SELECT locked_by, started_at
      FROM pgfence.jobs
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
), put_back AS (
    UPDATE pgfence.jobs
       SET status      = 'queued',
           putbacks    = putbacks + 1,
           run_at      = now() + make_interval(secs => %(delay)s::float8),
           locked_by   = NULL,
           lease_until = NULL,
           last_error  = %(detail)s
     WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
    RETURNING id, kind
), closed AS (
    UPDATE pgfence.limits l
       SET rate_tat = greatest(coalesce(l.rate_tat, now()),
                               now() + make_interval(secs => %(delay)s::float8
                                   + pgfence.rate_tolerance(l.rate_count, l.rate_period)))
      FROM put_back p
     WHERE l.kind = p.kind AND l.rate_count IS NOT NULL
    RETURNING l.kind
), noted AS (
    INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail)
    SELECT %(id)s, %(attempt)s, m.locked_by, m.started_at, 'released', %(detail)s
      FROM mine m
     WHERE EXISTS (SELECT 1 FROM put_back)
    ON CONFLICT DO NOTHING
)
SELECT id FROM put_back;
