-- name: claim
-- Claim up to %(batch)s jobs from %(queues)s: queued jobs whose run_at has
-- come and, when %(reclaim)s, running jobs whose lease has expired
-- (reclaims), highest priority first, then oldest run_at, then id.  Every
-- claim bumps attempt, the fencing token.  A reclaim on the final attempt,
-- or past max_reclaims, turns the job failed instead of running it again.
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
-- queued jobs alone, so running jobs cost the claim nothing; running jobs
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
                   reclaims AS new_reclaims, max_reclaims, priority, run_at
              FROM pgfence.jobs
             WHERE queue = wanted.queue AND status = 'queued' AND run_at <= now()
               AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
               AND (%(not_kinds)s::text[] IS NULL OR kind <> ALL(%(not_kinds)s::text[]))
             ORDER BY priority DESC, run_at, id
             LIMIT %(batch)s
               FOR UPDATE SKIP LOCKED) AS queued
        UNION ALL
        SELECT * FROM (
            SELECT id, status, attempt - putbacks, max_attempts,
                   reclaims + 1, max_reclaims, priority, run_at
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
    SELECT id, prev_status, new_reclaims,
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
)
UPDATE pgfence.jobs j
   SET status      = CASE WHEN d.verdict IS NULL THEN 'running' ELSE 'failed' END,
       attempt     = CASE WHEN d.verdict IS NULL THEN j.attempt + 1 ELSE j.attempt END,
       reclaims    = d.new_reclaims,
       locked_by   = CASE WHEN d.verdict IS NULL THEN %(worker)s END,
       lease_until = CASE WHEN d.verdict IS NULL THEN
                         now() + make_interval(secs => coalesce(
                             (SELECT l.lease FROM unnest(%(lease_kinds)s::text[], %(lease_secs)s::float8[]) AS l(kind, lease)
                               WHERE l.kind = j.kind LIMIT 1),
                             %(lease)s::float8))
                     END,
       started_at  = CASE WHEN d.verdict IS NULL THEN now() ELSE j.started_at END,
       finished_at = CASE WHEN d.verdict IS NULL THEN NULL ELSE now() END,
       last_error  = coalesce(d.verdict, j.last_error)
  FROM decided d
 WHERE j.id = d.id
RETURNING j.id, j.queue, j.kind, j.payload::text, j.status, j.attempt, j.max_attempts,
          j.reclaims, j.max_reclaims, j.priority, j.dedupe_key, j.created_at,
          j.run_at, j.last_error, d.prev_status;

-- name: complete
-- Fenced completion: marks the job done only while this attempt still owns
-- it.  Zero rows means the lease was lost and the caller must roll back.
UPDATE pgfence.jobs
   SET status = 'done', finished_at = now(), locked_by = NULL, lease_until = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING id;

-- name: complete_or_raise
-- The fenced completion for a pipelined block (Job.fenced(pipeline=True)):
-- raises SQLSTATE PF001 when this attempt no longer owns the job, which
-- aborts the transaction before the COMMIT queued behind it.
SELECT pgfence.complete_fenced(%(id)s, %(attempt)s);

-- name: complete_many
-- Fenced completion of many jobs in one statement (handlers that wrote
-- nothing of their own); returns the ids that were still owned.  The rows
-- are locked in id order first, like every statement that locks many jobs
-- (see renew in heartbeat.sql): no deadlock with the heartbeat's renewal.
-- The fence is in the lock: only rows of this attempt, still running, are
-- locked (a row changed meanwhile is checked again as it is locked), and
-- nothing changes a locked row before this statement does.  The update
-- then finds them by id alone: with status = 'running' there too, a
-- generic plan made while the statistics counted few running jobs (right
-- after a bulk enqueue) scanned the running jobs once per job completed,
-- a cost that grew with the square of the batch.
WITH owned AS (
    SELECT j.id
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS f(id, attempt)
      JOIN pgfence.jobs j ON j.id = f.id AND j.attempt = f.attempt AND j.status = 'running'
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE pgfence.jobs j
   SET status = 'done', finished_at = now(), locked_by = NULL, lease_until = NULL
  FROM owned o
 WHERE j.id = o.id
RETURNING j.id;

-- name: fail_or_retry
-- Fenced error report: back to queued with run_at pushed by the backoff, or
-- failed once the attempts are spent (attempt - putbacks: put-backs spent
-- none).  A stale worker's report matches nothing.  last_traceback is the
-- error's traceback, or NULL when it has none.
UPDATE pgfence.jobs
   SET status         = CASE WHEN attempt - putbacks >= max_attempts OR %(final)s THEN 'failed' ELSE 'queued' END,
       run_at         = CASE WHEN attempt - putbacks >= max_attempts OR %(final)s THEN run_at
                             ELSE now() + make_interval(secs => %(backoff)s::float8) END,
       finished_at    = CASE WHEN attempt - putbacks >= max_attempts OR %(final)s THEN now() END,
       last_error     = %(error)s,
       last_traceback = %(traceback)s,
       locked_by      = NULL,
       lease_until    = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING status, queue, kind, attempt - putbacks AS spent, max_attempts;

-- name: put_back_unknown
-- Fenced put-back of a job whose kind this worker does not know (a rolling
-- deploy: a worker that knows it may not be up yet).  The job goes back to
-- queued with run_at %(delay)s seconds from now and putbacks + 1, so the
-- attempt this claim took is not counted as spent; attempt itself stays, as
-- the fencing token never goes back.  Once the job is %(give_up)s seconds
-- old (from created_at, by the database clock) it is failed instead, with
-- %(error)s.  Returns the new status; no row when this attempt no longer
-- owns the job.
UPDATE pgfence.jobs j
   SET status         = CASE WHEN d.give_up THEN 'failed' ELSE 'queued' END,
       putbacks       = j.putbacks + CASE WHEN d.give_up THEN 0 ELSE 1 END,
       run_at         = CASE WHEN d.give_up THEN j.run_at
                             ELSE now() + make_interval(secs => %(delay)s::float8) END,
       finished_at    = CASE WHEN d.give_up THEN now() END,
       last_error     = CASE WHEN d.give_up THEN %(error)s ELSE j.last_error END,
       last_traceback = CASE WHEN d.give_up THEN NULL ELSE j.last_traceback END,
       locked_by      = NULL,
       lease_until    = NULL
  FROM (SELECT created_at <= now() - make_interval(secs => %(give_up)s::float8) AS give_up
          FROM pgfence.jobs WHERE id = %(id)s) d
 WHERE j.id = %(id)s AND j.attempt = %(attempt)s AND j.status = 'running'
RETURNING j.status;

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
             WHERE queue = wanted.queue AND status = 'queued'
             ORDER BY priority DESC LIMIT 1) AS priority
      FROM unnest(%(queues)s::text[]) AS wanted(queue)
    UNION ALL
    SELECT p.queue,
           (SELECT priority FROM pgfence.jobs
             WHERE queue = p.queue AND status = 'queued' AND priority < p.priority
             ORDER BY priority DESC LIMIT 1)
      FROM priorities p
     WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(
           (SELECT run_at FROM pgfence.jobs
             WHERE queue = p.queue AND status = 'queued' AND priority = p.priority AND run_at > now()
             ORDER BY priority DESC, run_at LIMIT 1)) - now())::float8
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
-- against the reclaim budget).
UPDATE pgfence.jobs
   SET status      = 'queued',
       locked_by   = NULL,
       lease_until = NULL,
       reclaims    = reclaims + CASE WHEN %(reclaim)s THEN 1 ELSE 0 END,
       last_error  = coalesce(%(reason)s, last_error)
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
RETURNING id, queue, kind;

-- name: enqueue
-- Enqueue one job through the SQL function, in the caller's transaction.
-- A delay is added to the database clock, like every other time pgfence keeps.
SELECT pgfence.enqueue(%(kind)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
                       coalesce(%(run_at)s::timestamptz,
                                now() + make_interval(secs => %(delay)s::float8)),
                       %(max_attempts)s, %(dedupe_key)s, %(max_reclaims)s);

-- name: complete_unfenced
-- UNSAFE, used only by `pgfence demo` to show what happens without the fence:
-- completes by id alone, as most queues do.
UPDATE pgfence.jobs
   SET status = 'done', finished_at = now(), locked_by = NULL, lease_until = NULL
 WHERE id = %(id)s
RETURNING id;

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
