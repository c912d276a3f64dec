-- The producer's statements beyond the one-job enqueue of jobs.sql
-- (pgfence.store.client).

-- name: enqueue_many
-- Enqueue many jobs in one statement, in the caller's transaction: one
-- array per column, element n of each being job n.  Each job's id is taken
-- from the table's identity sequence first, in input order, so that the ids
-- come back in the order the jobs were given and a batch's jobs are claimed
-- in that order among equals.  A NULL queue, max_attempts or max_reclaims
-- takes the kind's option from pgfence.kinds, else the default ('default',
-- 5, 3), as the jobs_kind_options trigger does for one job: joined here, so
-- that the rows reach the insert complete and the trigger's WHEN keeps its
-- per-row call off them.  A NULL run_at is now() plus the job's delay (the
-- database clock).
--
-- A job whose dedupe key a live job of its kind holds (or an earlier job of
-- the same batch) is not inserted, and its id comes back NULL: the caller
-- finds the holder (pgfence.store.client.enqueue_many).  The statement has
-- no look-up of its own, which would be planned per row: its estimated cost
-- then passed jit_above_cost, and JIT compilation took 356 ms of a 10,000
-- job statement's 523.
--
-- One notification per queue that got a job, as a burst of enqueue() calls
-- in one transaction gives.
WITH given AS (
    SELECT nextval(pg_get_serial_sequence('pgfence.jobs', 'id')) AS id, g.*
      FROM unnest(%(kinds)s::text[], %(payloads)s::text[], %(queues)s::text[], %(priorities)s::int4[],
                  %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int4[],
                  %(max_reclaims)s::int4[], %(dedupe_keys)s::text[])
           WITH ORDINALITY AS g(kind, payload, queue, priority, run_at, delay, max_attempts, max_reclaims,
                                dedupe_key, n)
     ORDER BY g.n
), inserted AS (
    INSERT INTO pgfence.jobs (id, kind, payload, queue, priority, run_at, max_attempts, max_reclaims, dedupe_key)
    OVERRIDING SYSTEM VALUE
    SELECT g.id, g.kind, coalesce(g.payload::jsonb, '{}'::jsonb), coalesce(g.queue, k.queue, 'default'),
           coalesce(g.priority, 0), coalesce(g.run_at, now() + make_interval(secs => coalesce(g.delay, 0))),
           coalesce(g.max_attempts, k.max_attempts, 5), coalesce(g.max_reclaims, k.max_reclaims, 3), g.dedupe_key
      FROM given g
      LEFT JOIN pgfence.kinds k ON k.kind = g.kind
     ORDER BY g.n
    ON CONFLICT (kind, dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
    RETURNING id, kind, dedupe_key, queue
), notified AS (
    SELECT count(pg_notify('pgfence_jobs', queue)) AS queues
      FROM (SELECT DISTINCT queue FROM inserted) q
)
SELECT i.id
  FROM given g
  LEFT JOIN inserted i ON i.id = g.id
 CROSS JOIN notified
 ORDER BY g.n;
