-- The jobs table, its indexes and the enqueue function.
--
-- attempt is the fencing token: every claim bumps it, and every write that
-- depends on owning a job carries (id, attempt) in its WHERE clause.

CREATE TABLE pgfence.jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL DEFAULT 'default',
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status       text        NOT NULL DEFAULT 'queued',
    attempt      integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL DEFAULT 5,
    reclaims     integer     NOT NULL DEFAULT 0,
    max_reclaims integer     NOT NULL DEFAULT 3,
    priority     integer     NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    locked_by    text,
    lease_until  timestamptz,
    dedupe_key   text,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    CONSTRAINT jobs_status_check
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT jobs_kind_check CHECK (kind <> ''),
    CONSTRAINT jobs_queue_check CHECK (queue <> ''),
    CONSTRAINT jobs_attempt_check CHECK (attempt >= 0),
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT jobs_max_reclaims_check CHECK (max_reclaims >= 0),
    CONSTRAINT jobs_running_lease_check
        CHECK (status <> 'running' OR lease_until IS NOT NULL)
);

-- Claiming reads only live rows: the partial index holds queued and running
-- jobs alone, so a million finished rows cost the claim nothing.
CREATE INDEX jobs_claim_idx ON pgfence.jobs (queue, priority DESC, run_at, id)
    WHERE status IN ('queued', 'running');

-- A dedupe key names at most one live job of a kind.
CREATE UNIQUE INDEX jobs_dedupe_idx ON pgfence.jobs (kind, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running');

-- Retention deletes finished rows oldest first, in keyset batches.
CREATE INDEX jobs_finished_idx ON pgfence.jobs (finished_at, id)
    WHERE status IN ('done', 'failed', 'cancelled');

-- enqueue: the one way a job enters the table, for SQL producers and for
-- pgfence's own Python API alike.  It runs in the caller's transaction, so a
-- job is enqueued together with the caller's business write or not at all.
-- With a dedupe key it returns the live job that already holds that key.
CREATE FUNCTION pgfence.enqueue(
    p_kind         text,
    p_payload      jsonb       DEFAULT '{}'::jsonb,
    p_queue        text        DEFAULT 'default',
    p_priority     integer     DEFAULT 0,
    p_run_at       timestamptz DEFAULT NULL,
    p_max_attempts integer     DEFAULT NULL,
    p_dedupe_key   text        DEFAULT NULL,
    p_max_reclaims integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    LOOP
        INSERT INTO pgfence.jobs
            (kind, payload, queue, priority, run_at, max_attempts, max_reclaims, dedupe_key)
        VALUES
            (p_kind, coalesce(p_payload, '{}'::jsonb), coalesce(p_queue, 'default'),
             coalesce(p_priority, 0), coalesce(p_run_at, now()),
             coalesce(p_max_attempts, 5), coalesce(p_max_reclaims, 3), p_dedupe_key)
        ON CONFLICT (kind, dedupe_key)
            WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
            DO NOTHING
        RETURNING id INTO v_id;
        IF v_id IS NOT NULL THEN
            -- Notifications with the same payload in one transaction are
            -- delivered once, so a burst of enqueues wakes workers once.
            PERFORM pg_notify('pgfence_jobs', coalesce(p_queue, 'default'));
            RETURN v_id;
        END IF;
        SELECT id INTO v_id FROM pgfence.jobs
         WHERE kind = p_kind AND dedupe_key = p_dedupe_key
           AND status IN ('queued', 'running');
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
        -- The holder finished between our insert and our look-up: try again.
    END LOOP;
END;
$$;
