-- name: periodic_declare
-- A supervisor's schedule, as it declares it at start and on reload.  A new
-- schedule owes no tick before now; a known one keeps its checked_until,
-- so that ticks missed while no supervisor ran are caught up as its
-- catch_up says.
INSERT INTO pgfence.schedules AS s (name, kind, queue, cron, every_seconds, tz, payload, overlap, catch_up)
VALUES (%(name)s, %(kind)s, %(queue)s, %(cron)s, %(every_seconds)s, %(tz)s, %(payload)s, %(overlap)s,
        %(catch_up)s)
ON CONFLICT (name) DO UPDATE
   SET kind = excluded.kind, queue = excluded.queue, cron = excluded.cron,
       every_seconds = excluded.every_seconds, tz = excluded.tz, payload = excluded.payload,
       overlap = excluded.overlap, catch_up = excluded.catch_up, declared_at = now();

-- name: periodic_lock
-- The schedules this round decides, locked; one another supervisor is
-- deciding right now is skipped (it decides the same ticks).  busy: the
-- job of its last enqueued tick is still queued or running (pgfence.jobs
-- holds live jobs only).  queued: ticks waiting behind it.  now: the
-- database's clock, read after the locks are held: the only clock that
-- decides whether a tick is due.
SELECT s.name, s.checked_until, s.last_tick, s.last_job_id,
       EXISTS (SELECT 1 FROM pgfence.jobs j WHERE j.id = s.last_job_id) AS busy,
       ARRAY(SELECT t.tick FROM pgfence.schedule_ticks t
              WHERE t.schedule = s.name AND t.outcome = 'queued' ORDER BY t.tick) AS queued,
       clock_timestamp() AS now
  FROM pgfence.schedules s
 WHERE s.name = ANY(%(names)s)
 ORDER BY s.name
   FOR UPDATE OF s SKIP LOCKED;

-- name: periodic_enqueue
-- One tick's job and its row, in one statement: the primary key of
-- pgfence.schedule_ticks refuses a second row for the same tick, and the
-- whole round (its jobs too) rolls back with it.  The job's dedupe key
-- names the tick, so job.scheduled_for and its idempotency key follow.
INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome, job_id)
SELECT %(schedule)s, %(tick)s, 'enqueued',
       pgfence.enqueue(%(kind)s, %(payload)s, %(queue)s, 0, NULL, NULL, %(dedupe_key)s, NULL)
RETURNING job_id, extract(epoch FROM decided_at - tick)::float8 AS lag;

-- name: periodic_record
-- A tick decided without a job: skipped, or queued behind the running one.
INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome)
VALUES (%(schedule)s, %(tick)s, %(outcome)s);

-- name: periodic_dequeue
-- A queued tick's turn: its previous run ended.  Its job is enqueued now.
UPDATE pgfence.schedule_ticks
   SET outcome = 'enqueued', decided_at = clock_timestamp(),
       job_id = pgfence.enqueue(%(kind)s, %(payload)s, %(queue)s, 0, NULL, NULL, %(dedupe_key)s, NULL)
 WHERE schedule = %(schedule)s AND tick = %(tick)s AND outcome = 'queued'
RETURNING job_id, extract(epoch FROM decided_at - tick)::float8 AS lag;

-- name: periodic_advance
-- The round decided every tick up to now.
UPDATE pgfence.schedules
   SET checked_until = greatest(checked_until, %(now)s),
       last_tick = coalesce(%(last_tick)s, last_tick),
       last_job_id = coalesce(%(last_job_id)s, last_job_id),
       missed_ticks = missed_ticks + %(missed)s
 WHERE name = %(name)s;

-- name: periodic_last_runs
-- The status of each schedule's last enqueued job (NULL: none yet, or
-- gone from history with retention).
SELECT s.name, (SELECT a.status FROM pgfence.all_jobs a WHERE a.id = s.last_job_id LIMIT 1) AS status
  FROM pgfence.schedules s
 WHERE s.name = ANY(%(names)s);

-- name: periodic_list
-- Every schedule, for `pgfence periodic`: its definition, its last tick
-- enqueued and that job's status, and its skipped, queued and missed ticks.
SELECT s.name, s.kind, s.queue, s.cron, s.every_seconds, s.tz, s.payload, s.overlap, s.catch_up,
       s.declared_at, s.checked_until, s.last_tick, s.last_job_id,
       (SELECT a.status FROM pgfence.all_jobs a WHERE a.id = s.last_job_id LIMIT 1) AS last_status,
       (SELECT count(*) FROM pgfence.schedule_ticks t WHERE t.schedule = s.name AND t.outcome = 'skipped')
           AS skipped,
       (SELECT count(*) FROM pgfence.schedule_ticks t WHERE t.schedule = s.name AND t.outcome = 'queued')
           AS queued,
       s.missed_ticks, clock_timestamp() AS now
  FROM pgfence.schedules s
 ORDER BY s.name;

-- name: periodic_prune
-- Ticks decided longer ago than the retention, in batches (keyset by the
-- primary key); queued ticks stay until their turn.
WITH old AS (
    SELECT schedule, tick FROM pgfence.schedule_ticks
     WHERE decided_at < now() - make_interval(secs => %(retention)s) AND outcome <> 'queued'
     LIMIT %(batch)s)
DELETE FROM pgfence.schedule_ticks t USING old
 WHERE t.schedule = old.schedule AND t.tick = old.tick;

-- name: periodic_clock
-- The database's clock, for a round that locked no schedule.
SELECT clock_timestamp() AS now;
