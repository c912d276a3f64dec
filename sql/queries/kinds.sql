-- name: kinds_register
-- Record the options of the kinds a starting worker's handlers define, all
-- in one statement (parallel arrays, one element per kind).  A row is
-- written only when an option changed, so that restarts and a fleet of
-- identical workers leave the table alone; when two versions of a handler
-- disagree during a rolling deploy, the last to start wins.
INSERT INTO pgfence.kinds AS k (kind, queue, max_attempts, max_reclaims, lease, timeout, updated_by)
SELECT kind, queue, max_attempts, max_reclaims, lease, timeout, %(by)s
  FROM unnest(%(kinds)s::text[], %(queues)s::text[], %(max_attempts)s::integer[],
              %(max_reclaims)s::integer[], %(leases)s::float8[], %(timeouts)s::float8[])
       AS t (kind, queue, max_attempts, max_reclaims, lease, timeout)
ON CONFLICT (kind) DO UPDATE
   SET queue = EXCLUDED.queue, max_attempts = EXCLUDED.max_attempts,
       max_reclaims = EXCLUDED.max_reclaims, lease = EXCLUDED.lease, timeout = EXCLUDED.timeout,
       updated_at = now(), updated_by = EXCLUDED.updated_by
 WHERE (k.queue, k.max_attempts, k.max_reclaims, k.lease, k.timeout) IS DISTINCT FROM
       (EXCLUDED.queue, EXCLUDED.max_attempts, EXCLUDED.max_reclaims, EXCLUDED.lease, EXCLUDED.timeout)
RETURNING kind;

-- name: kind_known
-- Whether a worker has registered this kind (pgfence enqueue accepts it
-- without the handler's module).
SELECT EXISTS (SELECT 1 FROM pgfence.kinds WHERE kind = %(kind)s);
