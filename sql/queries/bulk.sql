-- name: bulk_create
-- A new bulk action of the dashboard (migration 0013), running and owned by
-- no runner yet: the first runner that looks takes it.  Its id.
INSERT INTO pgfence.bulk_actions (action, filter, upto, batch, started_by)
VALUES (%(action)s, %(filter)s, %(upto)s, %(batch)s, %(by)s)
RETURNING id;

-- name: bulk_claim
-- Take the oldest running bulk action that no live runner holds: owned by
-- none, by this runner already (it reconnected), by a runner whose lease
-- ran out, or by one whose database session is gone (its process died:
-- no need to wait for the lease).  A row another runner has locked is in
-- the middle of a batch and is skipped, never waited for.  Its id.
UPDATE pgfence.bulk_actions b
   SET owner = %(owner)s, owner_pid = pg_backend_pid(),
       lease_until = now() + make_interval(secs => %(lease)s::float8)
 WHERE b.id = (SELECT c.id FROM pgfence.bulk_actions c
                WHERE c.state = 'running'
                  AND (c.owner IS NULL OR c.owner = %(owner)s OR c.lease_until < now()
                       OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.owner_pid))
                ORDER BY c.id
                LIMIT 1
                  FOR UPDATE SKIP LOCKED)
RETURNING b.id;

-- name: bulk_lock
-- The bulk action %(id)s, locked until the batch's transaction ends, if
-- this runner still owns it and it still runs (a cancel, or a runner that
-- took it over, makes it return nothing).  A cancel waits for this lock:
-- for one batch at most.
SELECT id, action, filter, upto, batch, state, matched, acted, left_alone, batches, cursor, started_by, started_at,
       finished_at, cancelled_by, owner, lease_until, last_error
  FROM pgfence.bulk_actions
 WHERE id = %(id)s AND owner = %(owner)s AND state = 'running'
   FOR UPDATE;

-- name: bulk_counted
-- The count of the jobs the action matches, made by its first step, and
-- the lease renewed (in the step's transaction, the row locked).
UPDATE pgfence.bulk_actions
   SET matched = %(matched)s, owner_pid = pg_backend_pid(),
       lease_until = now() + make_interval(secs => %(lease)s::float8), last_error = NULL
 WHERE id = %(id)s AND owner = %(owner)s AND state = 'running';

-- name: bulk_progress
-- One batch done, in the batch's own transaction: the cursor moved to the
-- smallest id it read (NULL: kept), its counts added, the lease renewed,
-- and, with %(finished)s, the action done.
UPDATE pgfence.bulk_actions
   SET cursor = coalesce(%(cursor)s::bigint, cursor),
       acted = acted + %(acted)s, left_alone = left_alone + %(left_alone)s, batches = batches + %(batches)s,
       state = CASE WHEN %(finished)s::boolean THEN 'done' ELSE state END,
       finished_at = CASE WHEN %(finished)s::boolean THEN now() END,
       owner_pid = pg_backend_pid(), lease_until = now() + make_interval(secs => %(lease)s::float8),
       last_error = NULL
 WHERE id = %(id)s AND owner = %(owner)s AND state = 'running';

-- name: bulk_note_error
-- A batch that failed (rolled back, tried again): its error, for the page.
UPDATE pgfence.bulk_actions
   SET last_error = %(error)s
 WHERE id = %(id)s AND owner = %(owner)s AND state = 'running';

-- name: bulk_release
-- A runner that stops cleanly gives up the actions it holds: the next
-- runner takes them at once, without waiting for the lease.
UPDATE pgfence.bulk_actions
   SET owner = NULL, owner_pid = NULL, lease_until = NULL
 WHERE owner = %(owner)s AND state = 'running';

-- name: bulk_cancel
-- Cancel a running bulk action: its runner stops before its next batch
-- (one under way, which holds the row, commits first; this waits for it).
-- The row as cancelled; nothing when it was not running.
UPDATE pgfence.bulk_actions
   SET state = 'cancelled', cancelled_by = %(by)s, finished_at = now()
 WHERE id = %(id)s AND state = 'running'
RETURNING id, action, filter, upto, batch, state, matched, acted, left_alone, batches, cursor, started_by,
          started_at, finished_at, cancelled_by, owner, lease_until, last_error;

-- name: bulk_action
-- One bulk action, as its page shows it.
SELECT id, action, filter, upto, batch, state, matched, acted, left_alone, batches, cursor, started_by, started_at,
       finished_at, cancelled_by, owner, lease_until, last_error
  FROM pgfence.bulk_actions
 WHERE id = %(id)s;

-- name: bulk_recent
-- The newest bulk actions first: the audit the operations page lists.
SELECT id, action, filter, upto, batch, state, matched, acted, left_alone, batches, cursor, started_by, started_at,
       finished_at, cancelled_by, owner, lease_until, last_error
  FROM pgfence.bulk_actions
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: bulk_session
-- Once per connection of a runner: no statement longer than
-- %(statement_ms)s ms, and no wait for a lock longer than %(lock_ms)s ms (a
-- batch behind a job another transaction holds gives up, rolls back, and
-- is tried again, instead of holding its action's row meanwhile).
SELECT set_config('statement_timeout', %(statement_ms)s, false), set_config('lock_timeout', %(lock_ms)s, false);
