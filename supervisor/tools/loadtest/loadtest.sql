-- The load test's own statements (statements.py beside this file).  Each is
-- filtered by the run's queue, so other jobs in the same database are never
-- counted.

-- name: loadtest_enqueue
-- Enqueue one chunk of the run's jobs; n is each job's place in the chunk.
-- A job of a limited mix has its concurrency key (NULL for the others).
SELECT u.n, pgfence.enqueue(u.kind, u.payload, %(queue)s, 0, NULL, u.max_attempts, NULL, u.max_reclaims,
                            u.concurrency_key)
  FROM unnest(%(kinds)s::text[], %(payloads)s::jsonb[], %(attempts)s::int[], %(reclaims)s::int[],
              %(keys)s::text[])
       WITH ORDINALITY AS u(kind, payload, max_attempts, max_reclaims, concurrency_key, n)
 ORDER BY u.n;

-- name: loadtest_states
-- The run's jobs counted by status.
SELECT status, count(*)
  FROM pgfence.all_jobs
 WHERE queue = %(queue)s
 GROUP BY status;

-- name: loadtest_jobs
-- Every job of the run, as the audit reads it.
SELECT id, kind, status, attempt, reclaims, last_error, created_at, run_at, started_at, finished_at
  FROM pgfence.all_jobs
 WHERE queue = %(queue)s
 ORDER BY id;

-- name: loadtest_effects
-- The run's committed effect rows, per job in commit order.
SELECT t.job_id, t.id, t.attempt, t.worker
  FROM pgfence_examples.effects t
  JOIN pgfence.all_jobs j ON j.id = t.job_id
 WHERE j.queue = %(queue)s
 ORDER BY t.job_id, t.id;

-- name: loadtest_attempts
-- The attempts that pgfence.job_attempts records for the jobs %(ids)s (of
-- the run's queue: the caller's ids), each with how it ended: started_at
-- is its claim, ended_at its lease's end for a lease lost to a reclaim
-- (lease_until as the reclaim found it), else when its error, release or
-- cancel was written.  A job's attempt that completed it has no row: its
-- end is the job's finished_at.
SELECT a.job_id, a.attempt, a.outcome, a.started_at, a.ended_at
  FROM pgfence.job_attempts a
 WHERE a.job_id = ANY(%(ids)s::bigint[])
 ORDER BY a.job_id, a.attempt, a.outcome;

-- name: loadtest_receipts
-- The run's committed receipt rows, per job in commit order.
SELECT t.job_id, t.id, t.attempt, t.sent_status
  FROM pgfence_examples.receipts t
  JOIN pgfence.all_jobs j ON j.id = t.job_id
 WHERE j.queue = %(queue)s
 ORDER BY t.job_id, t.id;

-- name: loadtest_cancel_leftovers
-- Once the run's supervisors are gone (an interrupted or timed-out run),
-- its jobs still queued or running are cancelled (moved to history), so
-- none is left behind.
WITH moved AS (
    DELETE FROM pgfence.jobs
     WHERE queue = %(queue)s AND status IN ('queued', 'running')
    RETURNING id, now(), created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims,
              priority, putbacks, 'cancelled', queue, kind, dedupe_key, payload,
              'cancelled: the load test ended before this job', last_traceback, locked_by
)
INSERT INTO pgfence.job_history SELECT * FROM moved;

-- name: loadtest_backends
-- The run's worker and heartbeat connections among the backends behind its
-- proxy (the fault injector chooses which to terminate).
SELECT pid, backend_start, application_name
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s) AND datname = %(dbname)s
   AND (application_name LIKE 'pgfence worker %%' OR application_name = 'pgfence heartbeat')
 ORDER BY pid;

-- name: loadtest_terminate
-- Terminate one backend, only if it is still the one seen (pid and start).
SELECT pg_terminate_backend(pid)
  FROM pg_stat_activity
 WHERE pid = %(pid)s AND backend_start = %(started)s;

-- name: loadtest_deadlocks
-- Deadlocks PostgreSQL detected in this database so far (cumulative); the
-- audit compares the value before the run with the value after it.
SELECT deadlocks FROM pg_stat_database WHERE datname = current_database();

-- name: loadtest_clock
-- The database clock, which stamps started_at and finished_at: the audit
-- places each job's last claim on the faults' time line with it.
SELECT clock_timestamp();

-- name: loadtest_max_connections
-- The server's connection limit: the load test sizes its fleet below it.
SELECT current_setting('max_connections')::int;

-- name: loadtest_hold_snapshot
-- The xmin fault: run in a REPEATABLE READ transaction that the caller
-- leaves open, this takes the transaction's snapshot, which holds the
-- database's xmin horizon where it is until the transaction ends: VACUUM
-- can remove no row version that ended after it, as with a long report or
-- a session forgotten in a transaction.  Its backend and its xmin, for the
-- fault's event.
SELECT pg_backend_pid(), pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
