-- Concurrency limits (pgfence.store.limits; migration 0017).

-- name: limits_declare
-- Record the limits the loaded handlers declare (parallel arrays, one
-- element per kind), as kinds_register records their options: a row is
-- written only when a declared value changed, and a kind that declares
-- none gets a row only if it had one (its declared limits go back to
-- none).  The kinds written come back: their jobs are gated again next
-- (limits_gate), in the same transaction.
INSERT INTO pgfence.limits AS l (kind, declared_concurrency, declared_per_key, declared_rate_count,
                                 declared_rate_period, updated_by)
SELECT t.kind, t.concurrency, t.per_key, t.rate_count, t.rate_period, %(by)s
  FROM unnest(%(kinds)s::text[], %(concurrency)s::integer[], %(per_key)s::integer[], %(rate_counts)s::integer[],
              %(rate_periods)s::float8[]) AS t (kind, concurrency, per_key, rate_count, rate_period)
 WHERE t.concurrency IS NOT NULL OR t.per_key IS NOT NULL OR t.rate_count IS NOT NULL
    OR EXISTS (SELECT 1 FROM pgfence.limits e WHERE e.kind = t.kind)
ON CONFLICT (kind) DO UPDATE
   SET declared_concurrency = EXCLUDED.declared_concurrency, declared_per_key = EXCLUDED.declared_per_key,
       declared_rate_count = EXCLUDED.declared_rate_count, declared_rate_period = EXCLUDED.declared_rate_period,
       -- A new rate starts with a full burst, not the old one's schedule.
       rate_tat = CASE WHEN (l.declared_rate_count, l.declared_rate_period)
                            IS DISTINCT FROM (EXCLUDED.declared_rate_count, EXCLUDED.declared_rate_period)
                       THEN NULL ELSE l.rate_tat END,
       updated_at = now(), updated_by = EXCLUDED.updated_by
 WHERE (l.declared_concurrency, l.declared_per_key, l.declared_rate_count, l.declared_rate_period)
       IS DISTINCT FROM (EXCLUDED.declared_concurrency, EXCLUDED.declared_per_key, EXCLUDED.declared_rate_count,
                         EXCLUDED.declared_rate_period)
RETURNING kind;

-- name: limits_set
-- Set a kind's limits at run time (pgfence limits set): a NULL argument
-- leaves that limit as it was.  They win over the handler's declaration
-- until reset.
INSERT INTO pgfence.limits AS l (kind, set_concurrency, set_per_key, set_rate_count, set_rate_period, updated_by)
VALUES (%(kind)s, %(concurrency)s, %(per_key)s, %(rate_count)s, %(rate_period)s, %(by)s)
ON CONFLICT (kind) DO UPDATE
   SET set_concurrency = coalesce(EXCLUDED.set_concurrency, l.set_concurrency),
       set_per_key = coalesce(EXCLUDED.set_per_key, l.set_per_key),
       set_rate_count = coalesce(EXCLUDED.set_rate_count, l.set_rate_count),
       set_rate_period = coalesce(EXCLUDED.set_rate_period, l.set_rate_period),
       rate_tat = CASE WHEN EXCLUDED.set_rate_count IS NOT NULL THEN NULL ELSE l.rate_tat END,
       updated_at = now(), updated_by = EXCLUDED.updated_by
RETURNING kind, concurrency, per_key_concurrency;

-- name: limits_reset
-- Forget a kind's run-time limits: the handler's declaration applies
-- again.  The kind comes back if it had a row.
UPDATE pgfence.limits
   SET set_concurrency = NULL, set_per_key = NULL, set_rate_count = NULL, set_rate_period = NULL,
       rate_tat = NULL, updated_at = now(), updated_by = %(by)s
 WHERE kind = %(kind)s
RETURNING kind, concurrency, per_key_concurrency;

-- name: limits_forget
-- Drop a kind's row once it has no limit left, declared or set (after
-- limits_gate freed its jobs): the kind no longer shows among the limits.
DELETE FROM pgfence.limits
 WHERE kind = %(kind)s
   AND declared_concurrency IS NULL AND declared_per_key IS NULL AND declared_rate_count IS NULL
   AND set_concurrency IS NULL AND set_per_key IS NULL AND set_rate_count IS NULL;

-- name: limits_gate
-- Gate the live jobs of a kind whose limits changed, and admit what the
-- limits now let run (pgfence.gate); how many were admitted.
SELECT pgfence.gate(%(kind)s);

-- name: limits_list
-- Every kind with a limit: the limits in force
-- (and where they come from), the slots held (running, and admitted but not
-- yet claimed) and the jobs waiting, by reason.
SELECT l.kind, l.concurrency, l.per_key_concurrency, l.declared_concurrency, l.declared_per_key,
       l.set_concurrency, l.set_per_key,
       coalesce(u.running, 0) AS running, coalesce(u.admitted, 0) AS admitted,
       coalesce(u.waiting, 0) AS waiting, coalesce(u.scheduled, 0) AS scheduled,
       coalesce(u.keys, 0) AS keys, l.updated_at, l.updated_by, l.rate_count, l.rate_period,
       l.declared_rate_count, l.declared_rate_period, l.set_rate_count, l.set_rate_period
  FROM pgfence.limits l
  LEFT JOIN LATERAL (
      SELECT count(*) FILTER (WHERE status = 'running') AS running,
             count(*) FILTER (WHERE status = 'queued' AND held_back IS NULL) AS admitted,
             count(*) FILTER (WHERE held_back = 'concurrency') AS waiting,
             count(*) FILTER (WHERE held_back = 'scheduled') AS scheduled,
             count(DISTINCT concurrency_key) FILTER (WHERE held_back IS NULL) AS keys
        FROM pgfence.jobs j
       WHERE j.kind = l.kind AND j.gated) u ON true
 ORDER BY l.kind;

-- name: admit_due
-- Admit the held jobs whose run_at came (a delayed job, a retry's
-- backoff), if their limits allow: run on reclaim rounds and by an idle
-- worker.  Reads the held jobs scheduled and now due, nothing else.
SELECT pgfence.admit_due();

-- name: next_rate_at
-- Seconds until a kind's rate lets its next held job start (NULL: no kind
-- with a rate has jobs held, or its rate lets them start now and something
-- else holds them): an idle worker wakes then to admit it (admit_due).
SELECT extract(epoch FROM min(l.rate_tat - make_interval(
           secs => pgfence.rate_tolerance(l.rate_count, l.rate_period))) - now())::float8
  FROM pgfence.limits l
 WHERE l.rate_count IS NOT NULL
   AND l.rate_tat - make_interval(secs => pgfence.rate_tolerance(l.rate_count, l.rate_period))
       > now()
   AND EXISTS (SELECT 1 FROM pgfence.jobs j WHERE j.kind = l.kind AND j.held_back = 'concurrency');
