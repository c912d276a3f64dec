-- name: queue_pause
-- Pause a queue: its jobs are no longer claimed.  Returns the row when this
-- call paused it, nothing when it was paused already.  The workers learn it
-- from pgfence_pauses (payload: the queue), sent at commit.
WITH paused AS (
    INSERT INTO pgfence.queue_pauses (queue, paused_by)
    VALUES (%(queue)s, %(by)s)
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue, paused_at
)
SELECT p.queue, p.paused_at
  FROM paused p, LATERAL (SELECT pg_notify('pgfence_pauses', p.queue)) n;

-- name: queue_resume
-- Resume a paused queue; the row removed, nothing when it was not paused.
-- Notifies pgfence_pauses as queue_pause does, which also wakes the idle
-- workers of the queue.
WITH resumed AS (
    DELETE FROM pgfence.queue_pauses
     WHERE queue = %(queue)s
    RETURNING queue, paused_at
)
SELECT r.queue, r.paused_at
  FROM resumed r, LATERAL (SELECT pg_notify('pgfence_pauses', r.queue)) n;

-- name: queue_pauses
-- The paused queues, with when and by whom, by queue.
SELECT queue, paused_at, paused_by
  FROM pgfence.queue_pauses
 ORDER BY queue;

-- name: paused_among
-- Which of %(queues)s are paused: what a worker leaves out of its claims.
SELECT queue
  FROM pgfence.queue_pauses
 WHERE queue = ANY(%(queues)s::text[]);

-- name: supervisor_beat
-- Insert or refresh this supervisor's row: its children's jobs come as
-- parallel arrays (%(numbers)s and %(pids)s per child; %(job_slots)s, the
-- index of the child in those arrays, %(job_ids)s and %(attempts)s per job
-- held) and each job's kind and queue are read from pgfence.jobs by
-- (id, attempt) (a job ended since is left out).  started_at stays as
-- first written.
WITH child AS (
    SELECT c.ord, c.number, c.pid
      FROM unnest(%(numbers)s::int[], %(pids)s::int[]) WITH ORDINALITY AS c(number, pid, ord)
), held AS (
    SELECT h.slot, j.id, j.kind, j.queue, j.attempt
      FROM unnest(%(job_slots)s::int[], %(job_ids)s::bigint[], %(attempts)s::int[]) AS h(slot, id, attempt)
      JOIN pgfence.jobs j ON j.id = h.id AND j.attempt = h.attempt AND j.status = 'running'
)
INSERT INTO pgfence.supervisors AS s (instance, host, pid, workers, version, started_at, last_seen, children)
VALUES (%(instance)s, %(host)s, %(pid)s, %(workers)s, %(version)s, %(started_at)s, now(),
        coalesce((SELECT jsonb_agg(jsonb_build_object(
                      'number', c.number, 'pid', c.pid,
                      'jobs', coalesce((SELECT jsonb_agg(jsonb_build_object('id', h.id, 'kind', h.kind,
                                                                            'queue', h.queue, 'attempt', h.attempt)
                                                         ORDER BY h.id)
                                          FROM held h WHERE h.slot = c.ord), '[]'::jsonb))
                      ORDER BY c.number)
                    FROM child c), '[]'::jsonb))
ON CONFLICT (instance) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, workers = excluded.workers, version = excluded.version,
       last_seen = excluded.last_seen, children = excluded.children;

-- name: supervisor_gone
-- Delete this supervisor's row (a clean stop).
DELETE FROM pgfence.supervisors WHERE instance = %(instance)s;

-- name: supervisors_up
-- The supervisors seen within %(within)s seconds, by host and pid, with the
-- seconds since each was last seen.
SELECT instance, host, pid, workers, version, started_at, last_seen, children,
       extract(epoch FROM now() - last_seen)::float8 AS seen_ago
  FROM pgfence.supervisors
 WHERE last_seen >= now() - make_interval(secs => %(within)s::float8)
 ORDER BY host, pid, instance;
