-- The producer's statements (pgfence.store.client).

-- name: enqueue_one
-- jobs.sql's enqueue (pgfence.enqueue(), a delay added to the database
-- clock) with its parameters by position (kind, payload, queue, priority,
-- run_at, delay, max_attempts, dedupe_key, max_reclaims, concurrency_key: see
-- pgfence.store.client._one): named ones cost the producer's psycopg
-- about 5 us more CPU a call, 7% of what the round trip costs it.
SELECT pgfence.enqueue(%s, %s::jsonb, %s, %s, coalesce(%s::timestamptz, now() + make_interval(secs => %s::float8)),
                       %s, %s, %s, %s);

-- name: enqueue_default
-- enqueue_one for a job whose options are all at their defaults but its
-- queue (priority 0, to run now, no dedupe key, the kind's or the default
-- attempts and reclaims): pgfence.enqueue()'s own defaults, and three
-- parameters to send rather than nine (about 8 us less of psycopg's CPU a
-- call here).
SELECT pgfence.enqueue(%s, %s::jsonb, %s);

-- name: enqueue_many
-- Enqueue many jobs in one statement, in the caller's transaction: one
-- array per column, element n of each being job n (the payloads one JSON
-- array), a NULL array for a column at its default in every job (unnest
-- pads a missing array with NULLs), and for kinds when every job has the
-- same one, %(kind)s.  Each job's id is taken from the
-- table's identity sequence first, in input order, so that the ids come
-- back in the order the jobs were given and a batch's jobs are claimed in
-- that order among equals; the sequence is named once (an InitPlan), not
-- looked up by name for every row (2 us a job).  A NULL queue,
-- max_attempts or max_reclaims takes the kind's option from
-- pgfence.kinds, else the default ('default', 5, 3), as the
-- jobs_kind_options trigger does for one job: joined here, so that the
-- rows reach the insert complete and the trigger's WHEN keeps its per-row
-- call off them.  A NULL run_at is now() plus the job's delay (the
-- database clock).
--
-- Jobs without a dedupe key go in by a plain INSERT: ON CONFLICT would
-- make each row a speculative insertion (a lock and one more WAL record a
-- row); their ids were taken in order, so the order they are inserted in
-- does not matter, and no sort copies their rows again.  Keyed jobs go in
-- in the order given, so that of two with one key the first is kept.  A
-- job whose dedupe key a live job of its kind holds (or an earlier job of
-- the same batch) is not inserted: the second column lists the ids of the
-- keyed jobs that were, and the caller finds the holder of the others
-- (pgfence.store.client.enqueue_many).  The statement has no
-- look-up of its own, which would be planned per row: its estimated cost
-- then passed jit_above_cost, and JIT compilation took 356 ms of a 10,000
-- job statement's 523.  The ids come back as one value, not one row a job:
-- the first id when they are consecutive in the order given (nothing else
-- took a value of the sequence meanwhile), else the array of them.
--
-- One notification per queue that got a job, as a burst of enqueue() calls
-- in one transaction gives.
WITH given AS (
    SELECT nextval((SELECT pg_get_serial_sequence('pgfence.jobs', 'id')::regclass)) AS id, g.*
      FROM ROWS FROM (unnest(%(kinds)s::text[]), jsonb_array_elements(%(payloads)s::jsonb),
                      unnest(%(queues)s::text[]), unnest(%(priorities)s::int4[]),
                      unnest(%(run_ats)s::timestamptz[]), unnest(%(delays)s::float8[]),
                      unnest(%(max_attempts)s::int4[]), unnest(%(max_reclaims)s::int4[]),
                      unnest(%(dedupe_keys)s::text[]), unnest(%(concurrency_keys)s::text[]))
           WITH ORDINALITY AS g(kind, payload, queue, priority, run_at, delay, max_attempts, max_reclaims,
                                dedupe_key, concurrency_key, n)
     ORDER BY g.n
), plain AS (
    INSERT INTO pgfence.jobs (id, kind, payload, queue, priority, run_at, max_attempts, max_reclaims, concurrency_key)
    OVERRIDING SYSTEM VALUE
    SELECT g.id, coalesce(g.kind, %(kind)s), coalesce(g.payload, '{}'::jsonb), coalesce(g.queue, k.queue, 'default'),
           coalesce(g.priority, 0), coalesce(g.run_at, now() + make_interval(secs => coalesce(g.delay, 0))),
           coalesce(g.max_attempts, k.max_attempts, 5), coalesce(g.max_reclaims, k.max_reclaims, 3), g.concurrency_key
      FROM given g
      LEFT JOIN pgfence.kinds k ON k.kind = coalesce(g.kind, %(kind)s)
     WHERE g.dedupe_key IS NULL
    RETURNING queue
), keyed AS (
    INSERT INTO pgfence.jobs (id, kind, payload, queue, priority, run_at, max_attempts, max_reclaims, dedupe_key,
                              concurrency_key)
    OVERRIDING SYSTEM VALUE
    SELECT g.id, coalesce(g.kind, %(kind)s), coalesce(g.payload, '{}'::jsonb), coalesce(g.queue, k.queue, 'default'),
           coalesce(g.priority, 0), coalesce(g.run_at, now() + make_interval(secs => coalesce(g.delay, 0))),
           coalesce(g.max_attempts, k.max_attempts, 5), coalesce(g.max_reclaims, k.max_reclaims, 3), g.dedupe_key,
           g.concurrency_key
      FROM given g
      LEFT JOIN pgfence.kinds k ON k.kind = coalesce(g.kind, %(kind)s)
     WHERE g.dedupe_key IS NOT NULL
     ORDER BY g.n
    ON CONFLICT (kind, dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
    RETURNING id, queue
)
SELECT (SELECT CASE WHEN min(id - n) = max(id - n) THEN min(id)::text
                    ELSE array_agg(id ORDER BY n)::text END FROM given) AS ids,
       (SELECT array_agg(id) FROM keyed)::text AS keyed,
       (SELECT count(pg_notify('pgfence_jobs', queue))
          FROM (SELECT queue FROM plain UNION SELECT queue FROM keyed) q) AS queues;

-- name: enqueue_many_alike
-- enqueue_many for a batch whose jobs differ in their payloads alone (one
-- kind, queue, priority, delay, max_attempts and max_reclaims, NULL for a
-- default; no run_at, no dedupe key): a fan-out of one kind, the common
-- batch.  The same rows, ids, order and notification as enqueue_many, for
-- about 1 us a job less of the server's 6: the kind's options are read
-- once, not joined to each row, and the rows carry an id and a payload
-- alone through the statement.
WITH given AS (
    SELECT nextval((SELECT pg_get_serial_sequence('pgfence.jobs', 'id')::regclass)) AS id, g.payload, g.n
      FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS g(payload, n)
     ORDER BY g.n
), options AS (
    SELECT coalesce(%(queue)s::text, k.queue, 'default') AS queue,
           coalesce(%(max_attempts)s::int4, k.max_attempts, 5) AS max_attempts,
           coalesce(%(max_reclaims)s::int4, k.max_reclaims, 3) AS max_reclaims
      FROM (SELECT) one
      LEFT JOIN pgfence.kinds k ON k.kind = %(kind)s::text
), inserted AS (
    INSERT INTO pgfence.jobs (id, kind, payload, queue, priority, run_at, max_attempts, max_reclaims)
    OVERRIDING SYSTEM VALUE
    SELECT g.id, %(kind)s::text, g.payload, o.queue, %(priority)s::int4,
           now() + make_interval(secs => %(delay)s::float8), o.max_attempts, o.max_reclaims
      FROM given g
     CROSS JOIN options o
)
SELECT (SELECT CASE WHEN min(id - n) = max(id - n) THEN min(id)::text
                    ELSE array_agg(id ORDER BY n)::text END FROM given) AS ids,
       NULL::text AS keyed,
       (SELECT count(pg_notify('pgfence_jobs', queue)) FROM options) AS queues;
