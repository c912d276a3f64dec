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
