-- name: renew
-- Renew many leases in one statement.  A lease is renewed only while its
-- attempt still owns a running job; every requested id comes back with
-- renewed true or false and the job's current status, so the caller learns
-- per job which renewals failed and why.
WITH wanted AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(leases)s::float8[])
                  AS w(id, attempt, lease)
), renewed AS (
    UPDATE pgfence.jobs j
       SET lease_until = now() + make_interval(secs => w.lease)
      FROM wanted w
     WHERE j.id = w.id AND j.attempt = w.attempt AND j.status = 'running'
    RETURNING j.id, j.attempt
)
SELECT w.id, w.attempt, (r.id IS NOT NULL) AS renewed, j.status, j.attempt AS current_attempt
  FROM wanted w
  LEFT JOIN renewed r ON r.id = w.id AND r.attempt = w.attempt
  LEFT JOIN pgfence.jobs j ON j.id = w.id;

-- name: local_statement_timeout
-- Bound the rest of this transaction (the renewal) to %(ms)s milliseconds.
SELECT set_config('statement_timeout', %(ms)s, true);
