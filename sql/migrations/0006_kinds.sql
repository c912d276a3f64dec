-- Each job kind's options, kept in the database so that every producer
-- applies them: pgfence.enqueue() from SQL or another language, the CLI
-- without --handlers, and a plain INSERT INTO pgfence.jobs alike.  Before,
-- only a producer that had imported the handler's module knew them, and a
-- job enqueued anywhere else landed on the 'default' queue with 5 attempts,
-- where no worker of its real queue would ever claim it.
--
-- `pgfence run` and `pgfence work` write the options of the handlers they
-- load at start (kinds_register).  A NULL option means the handler does not
-- set it: the job gets the old defaults ('default', 5 attempts, 3 reclaims;
-- the worker's lease and timeout).  Rows of kinds no longer registered are
-- kept: during a rolling deploy the workers not yet upgraded still run them.
CREATE TABLE pgfence.kinds (
    kind         text PRIMARY KEY,
    queue        text,
    max_attempts integer,
    max_reclaims integer,
    lease        double precision,
    timeout      double precision,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text,
    CONSTRAINT kinds_kind_check CHECK (kind <> ''),
    CONSTRAINT kinds_queue_check CHECK (queue <> ''),
    CONSTRAINT kinds_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT kinds_max_reclaims_check CHECK (max_reclaims >= 0),
    CONSTRAINT kinds_lease_check CHECK (lease > 0),
    CONSTRAINT kinds_timeout_check CHECK (timeout > 0)
);

-- The three columns lose their defaults so that a row inserted without
-- them arrives as NULL, which the trigger below can tell from a value the
-- producer chose; it fills them in before the NOT NULL constraints are
-- checked.  Only the catalog changes: no row is rewritten.
ALTER TABLE pgfence.jobs
    ALTER COLUMN queue DROP DEFAULT,
    ALTER COLUMN max_attempts DROP DEFAULT,
    ALTER COLUMN max_reclaims DROP DEFAULT;

-- The options a producer left out: the kind's (from pgfence.kinds), else
-- the old defaults.  An explicit value always wins.
CREATE FUNCTION pgfence.jobs_kind_options() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    k_queue        text;
    k_max_attempts integer;
    k_max_reclaims integer;
BEGIN
    SELECT queue, max_attempts, max_reclaims INTO k_queue, k_max_attempts, k_max_reclaims
      FROM pgfence.kinds WHERE kind = NEW.kind;
    NEW.queue        := coalesce(NEW.queue, k_queue, 'default');
    NEW.max_attempts := coalesce(NEW.max_attempts, k_max_attempts, 5);
    NEW.max_reclaims := coalesce(NEW.max_reclaims, k_max_reclaims, 3);
    RETURN NEW;
END;
$$;

-- The WHEN clause keeps the function call (and its look-up) off every
-- insert that already carries all three options, which then costs what it
-- did before.  An insert that leaves one out pays for the call: about 10 us
-- of server CPU per row (bench/README.md, "Enqueue cost of pgfence.kinds").
CREATE TRIGGER jobs_kind_options BEFORE INSERT ON pgfence.jobs
    FOR EACH ROW
    WHEN (NEW.queue IS NULL OR NEW.max_attempts IS NULL OR NEW.max_reclaims IS NULL)
    EXECUTE FUNCTION pgfence.jobs_kind_options();

-- enqueue, as in 0001, except that the options it is not given reach the
-- insert as NULL (p_queue's default is now NULL), so the trigger applies
-- the kind's, and the notification names the queue the job really went to.
-- CREATE OR REPLACE keeps the function's owner and grants; it may change a
-- parameter's default value as long as its type stays the same.
CREATE OR REPLACE FUNCTION pgfence.enqueue(
    p_kind         text,
    p_payload      jsonb       DEFAULT '{}'::jsonb,
    p_queue        text        DEFAULT NULL,
    p_priority     integer     DEFAULT 0,
    p_run_at       timestamptz DEFAULT NULL,
    p_max_attempts integer     DEFAULT NULL,
    p_dedupe_key   text        DEFAULT NULL,
    p_max_reclaims integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id    bigint;
    v_queue text;
BEGIN
    LOOP
        INSERT INTO pgfence.jobs
            (kind, payload, queue, priority, run_at, max_attempts, max_reclaims, dedupe_key)
        VALUES
            (p_kind, coalesce(p_payload, '{}'::jsonb), p_queue,
             coalesce(p_priority, 0), coalesce(p_run_at, now()),
             p_max_attempts, p_max_reclaims, p_dedupe_key)
        ON CONFLICT (kind, dedupe_key)
            WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running')
            DO NOTHING
        RETURNING id, queue INTO v_id, v_queue;
        IF v_id IS NOT NULL THEN
            -- Notifications with the same payload in one transaction are
            -- delivered once, so a burst of enqueues wakes workers once.
            PERFORM pg_notify('pgfence_jobs', v_queue);
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
