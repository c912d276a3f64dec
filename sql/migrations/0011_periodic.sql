-- Periodic jobs: schedules and the ticks decided for them.
--
-- Every supervisor runs a scheduler (a thread of its heartbeat process) for
-- the schedules it declares; there is no leader.  A scheduler decides the
-- ticks of a schedule with its row locked (FOR UPDATE SKIP LOCKED: another
-- supervisor deciding it at the same moment is skipped, not waited for),
-- on the database's clock, and moves checked_until to that clock's reading.
-- Each tick decided is a row of pgfence.schedule_ticks whose primary key is
-- (schedule, tick): the key, enforced here, that makes each tick enqueued
-- at most once whatever the number of supervisors, hosts or their clocks.
-- The tick's job is enqueued in the same transaction as its row.

CREATE TABLE pgfence.schedules (
    name          text        PRIMARY KEY,
    kind          text        NOT NULL,
    queue         text,
    -- Exactly one of cron (a cron expression in tz) and every_seconds.
    cron          text,
    every_seconds double precision,
    tz            text        NOT NULL DEFAULT 'UTC',
    payload       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    overlap       text        NOT NULL DEFAULT 'skip',
    catch_up      text        NOT NULL DEFAULT 'latest',
    -- When a supervisor declaring it last started or reloaded.
    declared_at   timestamptz NOT NULL DEFAULT now(),
    -- Every tick up to here is decided; a new schedule starts at its
    -- declaration (no tick before it is owed).
    checked_until timestamptz NOT NULL DEFAULT now(),
    -- The last tick whose job was enqueued, and that job.
    last_tick     timestamptz,
    last_job_id   bigint,
    -- Ticks that fell while no scheduler ran and catch_up left out.
    missed_ticks  bigint      NOT NULL DEFAULT 0,
    CONSTRAINT schedules_when_check CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CONSTRAINT schedules_every_check CHECK (every_seconds IS NULL OR every_seconds >= 1),
    CONSTRAINT schedules_overlap_check CHECK (overlap IN ('skip', 'allow', 'queue')),
    CONSTRAINT schedules_catch_up_check CHECK (catch_up IN ('latest', 'none', 'all'))
);

CREATE TABLE pgfence.schedule_ticks (
    schedule   text        NOT NULL,
    tick       timestamptz NOT NULL,
    -- enqueued: its job was enqueued; skipped: its previous run was still
    -- queued or running (overlap skip); queued: waiting for the previous
    -- run to end (overlap queue), then enqueued.
    outcome    text        NOT NULL,
    job_id     bigint,
    -- The database's clock when the tick was decided (and when a queued
    -- tick was enqueued): its lag is decided_at - tick.
    decided_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule, tick),
    CONSTRAINT schedule_ticks_outcome_check CHECK (outcome IN ('enqueued', 'skipped', 'queued')),
    CONSTRAINT schedule_ticks_job_check CHECK ((outcome = 'enqueued') = (job_id IS NOT NULL))
);

-- The ticks waiting behind a running one (overlap queue), oldest first.
CREATE INDEX schedule_ticks_queued_idx ON pgfence.schedule_ticks (schedule, tick) WHERE outcome = 'queued';
