-- name: renew
-- Renew many leases in one statement.  A lease is renewed only while its
-- attempt still owns a running job; the (id, attempt) pairs that come back
-- were renewed, the others were not (renew_verdicts says why).  Run after
-- renewal_settings, in the same transaction: the join must go through the
-- primary key.  The rows are locked first, in id order (the ORDER BY sits
-- below the row locks): every statement that locks many jobs locks them in
-- that one order, so a renewal and a batched completion of the same jobs
-- wait for each other instead of deadlocking, whatever order the arrays
-- come in.  The update finds the locked rows by id alone, as complete_many
-- does and for its reason (the fence is in the lock).
WITH owned AS (
    SELECT j.id, w.lease
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(leases)s::float8[]) AS w(id, attempt, lease)
      JOIN pgfence.jobs j ON j.id = w.id AND j.attempt = w.attempt AND j.status = 'running'
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE pgfence.jobs j
   SET lease_until = now() + make_interval(secs => o.lease)
  FROM owned o
 WHERE j.id = o.id
RETURNING j.id, j.attempt;

-- name: renew_verdicts
-- Why some leases were not renewed: their jobs' current status and attempt,
-- live or finished (sent only in a round that lost some).
SELECT id, status, attempt
  FROM pgfence.all_jobs
 WHERE id = ANY(%(ids)s::bigint[]);

-- name: renewal_settings
-- For the rest of this transaction (the renewal): a statement timeout of
-- %(ms)s milliseconds, an idle-in-transaction timeout of %(idle_ms)s ('0':
-- none; a heartbeat frozen between the renewal's statements must not keep
-- the rows it locked; see session_settings), and no sequential scan of the
-- jobs.  Right after a
-- bulk enqueue the statistics may still say that no job is running; the
-- planner then reads the whole table once per renewal instead of looking
-- each lease up by its primary key (measured: 400 ms instead of 20 ms for
-- 1,000 leases among 200,000 queued jobs).
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true),
       set_config('enable_seqscan', 'off', true);
