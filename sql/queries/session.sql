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
--
-- Every statement is planned for the table as it is when it runs
-- (force_custom_plan).  A plan made once and cached is made for the table
-- as it was: on an empty or just-truncated queue (a worker started before
-- the jobs came) PostgreSQL's generic plan of the claim reads the whole
-- table and sorts it, and the update joins every row with the batch: 4.5 s
-- a claim of 100 once 300,000 jobs had come, against 3 ms planned per
-- call.  PostgreSQL's default (auto) picks that generic plan by itself
-- after five calls on an empty table.  Planning costs a one-job claim
-- about 0.3 ms; a queue that stops draining costs everything.
SELECT set_config('plan_cache_mode', 'force_custom_plan', false), set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false),
       set_config('tcp_keepalives_idle', '5', false),
       set_config('tcp_keepalives_interval', '2', false),
       set_config('tcp_keepalives_count', '3', false);
