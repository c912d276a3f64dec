-- name: session_settings
-- Run once on each connection of a worker and of the heartbeat.  A session
-- left idle inside a transaction for %(idle_ms)s milliseconds is ended by
-- the server ('0': never), so the rows it locked are freed: a worker frozen
-- or cut off in the middle of a fenced() block, or between a statement and
-- its COMMIT, would otherwise hold them, and a reclaim (SKIP LOCKED) would
-- pass its jobs by.  Server-side TCP keepalives end the session of a host
-- that vanished within seconds, instead of the system's two hours (ignored
-- on a Unix socket).  Behind a transaction-pooling PgBouncer these land on
-- whichever server connection runs them: set PgBouncer's own
-- idle_transaction_timeout there (see README).
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false),
       set_config('tcp_keepalives_idle', '5', false),
       set_config('tcp_keepalives_interval', '2', false),
       set_config('tcp_keepalives_count', '3', false);

-- name: generic_plans
-- Run once on the own connection of every worker that prepares its
-- statements.  PostgreSQL's default (auto) keeps planning the claim anew on
-- every call: a generic plan never looks cheaper to it, as LIMIT and the
-- queue are parameters.  The generic plan is the same index scans
-- (jobs_queued_idx, jobs_running_idx, then the primary key) and saves the
-- planning, measured at 0.3 ms of a 0.8 ms one-job claim and 0.7 ms of a
-- 2 ms 50-job claim.  A one-job worker's handlers write on this session
-- too: their fenced() blocks plan as the server says (handler_plans).  Not
-- behind a transaction-pooling PgBouncer (nothing is prepared there).
SELECT set_config('plan_cache_mode', 'force_generic_plan', false);

-- name: handler_plans
-- First in a handler's fenced() transaction on a session that plans
-- pgfence's own statements generically (generic_plans): the handler's
-- statements are planned as they would be on any other session, by the
-- value the server, the database or the role set (DEFAULT ignores the
-- session's own change), until the transaction ends.
SET LOCAL plan_cache_mode TO DEFAULT;
