-- The dashboard's bulk actions: retry, cancel or delete every job matching
-- a filter, run in the background by a runner of a dashboard's process
-- (pgfence.web.bulk), one batch of jobs per transaction.  One row per
-- action: what was asked and by whom, how far it got, who runs it.  The
-- rows stay, as the audit of what operators did from the dashboard.
--
-- Each batch locks its action's row, checks that its runner still owns it,
-- acts on the next jobs below the cursor, and moves the cursor and the
-- counts in the same transaction: the progress shown is exact, and a
-- runner that takes over after another died (or stopped) starts where the
-- last committed batch ended, so no job is acted on twice.

CREATE TABLE pgfence.bulk_actions (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action       text        NOT NULL,
    -- The job list's filter as the pages show it: the fields set, by name
    -- ({"queue": "mail", "status": "failed"}; {} for every job).
    filter       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The largest id the confirmation counted: jobs that came after are
    -- left alone.
    upto         bigint      NOT NULL,
    -- Jobs per transaction.
    batch        integer     NOT NULL,
    state        text        NOT NULL DEFAULT 'running',
    -- The jobs that matched when the runner started (NULL: not counted yet).
    matched      bigint,
    acted        bigint      NOT NULL DEFAULT 0,
    -- Jobs a batch read but did not act on: their status changed meanwhile,
    -- a live job holds a retried job's dedupe key, a job to delete runs.
    left_alone   bigint      NOT NULL DEFAULT 0,
    batches      integer     NOT NULL DEFAULT 0,
    -- Jobs are taken newest first: every matching job with an id at or
    -- above the cursor was read by a committed batch (NULL: none yet).
    cursor       bigint,
    started_by   text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    -- When it ended: done, or cancelled.
    finished_at  timestamptz,
    cancelled_by text,
    -- The runner that holds the action, its session's backend pid, and the
    -- lease it renews with every batch.  Another runner takes the action
    -- over once the lease ran out or that session is gone.
    owner        text,
    owner_pid    integer,
    lease_until  timestamptz,
    -- The last batch that failed (it is tried again), cleared by the next
    -- batch that commits.
    last_error   text,
    CONSTRAINT bulk_actions_action_check CHECK (action IN ('retry', 'cancel', 'delete')),
    CONSTRAINT bulk_actions_state_check CHECK (state IN ('running', 'done', 'cancelled')),
    CONSTRAINT bulk_actions_batch_check CHECK (batch >= 1)
);

-- What runners look for when idle: the actions still running.
CREATE INDEX bulk_actions_running_idx ON pgfence.bulk_actions (id) WHERE state = 'running';
