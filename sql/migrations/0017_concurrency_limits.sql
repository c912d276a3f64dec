-- Concurrency limits: at most N jobs of a kind at once across every
-- supervisor (`concurrency`), and at most M at once of one concurrency key
-- of that kind (`per_key_concurrency`, the key given at enqueue).
--
-- A job subject to a limit is *gated*.  A gated job holds a slot of its
-- kind's limit (and of its key's) from the moment it is *admitted* until it
-- leaves the live table or goes back to waiting: while it is queued and
-- admitted, running, and running with an expired lease until a reclaim
-- hands the slot on to the next attempt of the same job.  A gated job that
-- is not admitted stays `queued` with `held_back` saying why it waits
-- ('concurrency': its kind's or its key's slots are all held; 'scheduled':
-- its run_at has not come), out of the claim's index: the claim never reads
-- it, however many wait.
--
-- Admission (pgfence.admit) counts the holders of a limit and admits the
-- next held jobs up to the limit, under a lock of the limit (the kind's
-- row in pgfence.limits for a kind concurrency, the key's advisory lock,
-- pgfence.lock_key, for a per-key limit alone) taken in its own statement,
-- so its count sees every admission committed before it (no count-then-act
-- race under READ COMMITTED).  Admission runs when a job enters (enqueue),
-- when a holder leaves (completion, failure, retry, put-back, release,
-- cancel, a reclaim's verdict: in the same transaction, at its commit), when
-- a limit changes, and for held jobs whose run_at came (admit_due, called
-- by each supervisor's renewal about once a second).  The locks are taken
-- at commit, in (kind, key) order, so two commits never wait for each other
-- in a cycle, and a producer's long transaction holds none.
--
-- The claim is unchanged but for `held_back IS NULL`: an admitted job is a
-- queued job like any other, claimed in priority order by any supervisor.
-- No limit is ever exceeded by a crash: a SIGKILLed or frozen holder keeps
-- its slot until its lease ends and a reclaim takes the job (the next
-- attempt inherits the slot) or fails it (the slot is freed), and the
-- attempt that lost its lease is fenced out at completion.

ALTER TABLE pgfence.jobs
    ADD COLUMN concurrency_key text,
    ADD COLUMN gated boolean NOT NULL DEFAULT false,
    ADD COLUMN held_back text,
    ADD CONSTRAINT jobs_concurrency_key_check
        CHECK (concurrency_key <> '' AND length(concurrency_key) <= 200 AND concurrency_key !~ '[[:cntrl:]]'),
    ADD CONSTRAINT jobs_held_back_check
        CHECK (held_back IS NULL OR (gated AND status = 'queued' AND held_back IN ('concurrency', 'scheduled')));

-- The claim reads admitted and ungated queued jobs only.
DROP INDEX pgfence.jobs_queued_idx;
CREATE INDEX jobs_queued_idx ON pgfence.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued' AND held_back IS NULL;
-- Held jobs waiting for a slot, in the order admission takes them: of a
-- kind, and of a key.  (A held job whose run_at has not come is
-- 'scheduled', in the index below alone, until admit_due finds it due.)
CREATE INDEX jobs_held_idx ON pgfence.jobs (kind, priority DESC, run_at, id)
    WHERE held_back = 'concurrency';
CREATE INDEX jobs_held_key_idx ON pgfence.jobs (kind, concurrency_key, priority DESC, run_at, id)
    WHERE held_back = 'concurrency';
-- The holders of a kind's and of a key's slots, counted by admission.
CREATE INDEX jobs_holders_idx ON pgfence.jobs (kind, concurrency_key)
    WHERE gated AND held_back IS NULL;
-- Held jobs whose run_at had not come, for admit_due.
CREATE INDEX jobs_held_scheduled_idx ON pgfence.jobs (run_at)
    WHERE held_back = 'scheduled';

-- The limits of each kind: declared by its handler (written when a worker
-- starts, like pgfence.kinds) and set at run time (pgfence limits set),
-- which wins until reset.  Every supervisor reads the one effective value.
CREATE TABLE pgfence.limits (
    kind                 text PRIMARY KEY,
    declared_concurrency integer,
    declared_per_key     integer,
    set_concurrency      integer,
    set_per_key          integer,
    -- A rate: at most rate_count starts a rate_period (seconds).
    declared_rate_count  integer,
    declared_rate_period double precision,
    set_rate_count       integer,
    set_rate_period      double precision,
    concurrency          integer GENERATED ALWAYS AS (coalesce(set_concurrency, declared_concurrency)) STORED,
    per_key_concurrency  integer GENERATED ALWAYS AS (coalesce(set_per_key, declared_per_key)) STORED,
    rate_count           integer GENERATED ALWAYS AS (coalesce(set_rate_count, declared_rate_count)) STORED,
    rate_period          double precision GENERATED ALWAYS AS (
                             CASE WHEN set_rate_count IS NOT NULL THEN set_rate_period
                                  ELSE declared_rate_period END) STORED,
    -- The rate's state (GCRA): the theoretical arrival time of the next
    -- start, advanced by rate_period / rate_count at each admission, under
    -- this row's lock, on the database clock.
    rate_tat             timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    updated_by           text,
    CONSTRAINT limits_kind_check CHECK (kind <> ''),
    CONSTRAINT limits_values_check CHECK (declared_concurrency >= 1 AND declared_per_key >= 1
                                          AND set_concurrency >= 1 AND set_per_key >= 1
                                          AND declared_rate_count >= 1 AND set_rate_count >= 1
                                          AND declared_rate_period > 0 AND set_rate_period > 0),
    CONSTRAINT limits_rate_check CHECK ((declared_rate_count IS NULL) = (declared_rate_period IS NULL)
                                        AND (set_rate_count IS NULL) = (set_rate_period IS NULL))
);

-- A rate's burst tolerance in seconds (GCRA's tau): a second's worth of
-- starts, or the period's if shorter, less the one step that every start
-- takes anyway.
CREATE FUNCTION pgfence.rate_tolerance(p_count integer, p_period double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, least(1.0, p_period) - p_period / p_count);
$$;

-- How many starts a rate lets through now, and the new theoretical arrival
-- time if that many go (GCRA): one every period/count seconds, with a burst
-- of up to a second's worth (or the period's, if shorter), so that a rate
-- holds over any minute within one burst; on the database's clock
-- (clock_timestamp: a long transaction's now() would be behind).
CREATE FUNCTION pgfence.rate_allows(p_count integer, p_period double precision, p_tat timestamptz,
                                    p_wanted integer, OUT allowed integer, OUT tat timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_step  double precision := p_period / p_count;
    v_tau   double precision := pgfence.rate_tolerance(p_count, p_period);
    v_now   timestamptz := clock_timestamp();
    v_start timestamptz := greatest(coalesce(p_tat, v_now), v_now);
    v_room  double precision := extract(epoch FROM v_now - v_start) + v_tau;
BEGIN
    allowed := CASE WHEN v_room < 0 THEN 0 ELSE least(p_wanted, floor(v_room / v_step)::integer + 1) END;
    tat := v_start + make_interval(secs => allowed * v_step);
END;
$$;

-- The lock under which a per-key limit admits: a transaction advisory lock
-- of (kind, key), hashed (two keys that share one only wait for each other;
-- a lock in memory costs no row write, where a row lock dirties a page at
-- every admission).  A kind with a concurrency of its own admits under its
-- pgfence.limits row, and takes the key's lock too.
CREATE FUNCTION pgfence.lock_key(p_kind text, p_key text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext(p_kind), hashtext(p_key));
$$;

-- The (kind, key) pairs a transaction at REPEATABLE READ or SERIALIZABLE
-- freed slots of or gated jobs of: it cannot admit them itself (see
-- admit_noted); the next admit_due does.
CREATE TABLE pgfence.admit_pending (
    kind            text NOT NULL,
    concurrency_key text
);

-- Admit the held jobs of kind p_kind (and key p_key) that the kind's
-- limits let run now; returns how many.  Called with the holders' changes
-- of this transaction made (an exit already deleted or held back).  Each
-- queue that got a job is notified, as an enqueue notifies it.
CREATE FUNCTION pgfence.admit(p_kind text, p_key text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_conc    integer;
    v_per_key integer;
    v_free    integer;
    v_n       integer := 0;
    v_keys    text[];
    v_limit   record;
    v_rate    record;
BEGIN
    SELECT concurrency, per_key_concurrency, rate_count INTO v_conc, v_per_key, v_free
      FROM pgfence.limits WHERE kind = p_kind;
    IF v_conc IS NULL AND v_free IS NULL AND (v_per_key IS NULL OR p_key IS NULL) THEN
        RETURN 0;   -- no limit applies (any more): pgfence.gate frees its jobs
    END IF;

    IF v_conc IS NULL AND v_free IS NULL THEN
        -- A per-key limit alone: the key's lock serializes its
        -- admissions.  The count and the pick below run in a statement
        -- after the lock, so they see every admission committed before it.
        PERFORM pgfence.lock_key(p_kind, p_key);
        WITH admitted AS (
            UPDATE pgfence.jobs SET held_back = NULL
             WHERE id IN (SELECT id FROM pgfence.jobs
                           WHERE kind = p_kind AND concurrency_key = p_key AND held_back = 'concurrency'
                           ORDER BY priority DESC, run_at, id
                           LIMIT greatest(0, v_per_key - (SELECT count(*) FROM pgfence.jobs
                                                           WHERE kind = p_kind AND concurrency_key = p_key
                                                             AND gated AND held_back IS NULL))
                             FOR UPDATE SKIP LOCKED)
            RETURNING queue)
        SELECT coalesce(sum(q.n), 0)::integer INTO v_n
          FROM (SELECT queue, count(*) AS n FROM admitted GROUP BY queue) q, pg_notify('pgfence_jobs', q.queue);
        RETURN v_n;
    END IF;

    -- A kind concurrency or a rate: the kind's row serializes its
    -- admissions; the limits are read again under the lock.  The slots
    -- free are the concurrency's (holders counted in a statement of their
    -- own) and the rate's (GCRA, its state on this row).
    SELECT concurrency, per_key_concurrency, rate_count, rate_period, rate_tat INTO v_limit
      FROM pgfence.limits WHERE kind = p_kind FOR NO KEY UPDATE;
    v_per_key := v_limit.per_key_concurrency;
    v_free := 500;
    IF v_limit.concurrency IS NOT NULL THEN
        SELECT least(v_free, v_limit.concurrency - count(*)) INTO v_free
          FROM pgfence.jobs WHERE kind = p_kind AND gated AND held_back IS NULL;
    END IF;
    IF v_limit.rate_count IS NOT NULL AND v_free > 0 THEN
        -- A rate counts starts: jobs admitted and not claimed yet (no
        -- worker free, or none running) take from its burst, so that no
        -- more than a burst of them can start at once when workers come.
        SELECT least(v_free, floor(pgfence.rate_tolerance(v_limit.rate_count, v_limit.rate_period)
                                    / (v_limit.rate_period / v_limit.rate_count))::integer + 1 - count(*))
          INTO v_free
          FROM pgfence.jobs WHERE kind = p_kind AND gated AND held_back IS NULL AND status = 'queued';
        v_rate := pgfence.rate_allows(v_limit.rate_count, v_limit.rate_period, v_limit.rate_tat,
                                      greatest(v_free, 0));
        v_free := v_rate.allowed;
    END IF;
    IF v_free <= 0 THEN
        RETURN 0;
    END IF;
    IF v_per_key IS NULL THEN
        WITH admitted AS (
            UPDATE pgfence.jobs SET held_back = NULL
             WHERE id IN (SELECT id FROM pgfence.jobs
                           WHERE kind = p_kind AND held_back = 'concurrency'
                           ORDER BY priority DESC, run_at, id
                           LIMIT v_free
                             FOR UPDATE SKIP LOCKED)
            RETURNING queue)
        SELECT coalesce(sum(q.n), 0)::integer INTO v_n
          FROM (SELECT queue, count(*) AS n FROM admitted GROUP BY queue) q, pg_notify('pgfence_jobs', q.queue);
        PERFORM pgfence.rate_spent(p_kind, v_limit.rate_count, v_limit.rate_period, v_limit.rate_tat, v_n);
        RETURN v_n;
    END IF;

    -- A kind limit and a per-key limit.  The keys that have jobs held are
    -- walked down jobs_held_key_idx (one descent each; at most 1,000 keys
    -- an admission, the next exit or admit_due goes on), their locks taken
    -- in hash order (for admissions under a key alone), each key's free
    -- slots counted, and its next held jobs up to them taken; of those, the
    -- first of every key goes before the second of any (round robin across
    -- the keys: a key with a long backlog does not starve the others), in
    -- priority, run_at, id order within a round.  Held jobs without a key
    -- have the kind's limit alone.  Under the kind's lock no other
    -- admission of the kind runs.
    WITH RECURSIVE keys AS (
        (SELECT concurrency_key AS key FROM pgfence.jobs
          WHERE kind = p_kind AND held_back = 'concurrency' AND concurrency_key IS NOT NULL
          ORDER BY concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.concurrency_key FROM pgfence.jobs j
                 WHERE j.kind = p_kind AND j.held_back = 'concurrency' AND j.concurrency_key > k.key
                 ORDER BY j.concurrency_key LIMIT 1)
          FROM keys k
         WHERE k.key IS NOT NULL
    )
    SELECT array_agg(key) INTO v_keys FROM (SELECT key FROM keys WHERE key IS NOT NULL LIMIT 1000) AS walked;
    PERFORM pg_advisory_xact_lock(hashtext(p_kind), h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(v_keys) AS k ORDER BY 1) AS locks;
    WITH keyed AS (
        SELECT c.id, c.priority, c.run_at, c.id_n AS n
          FROM (SELECT k.key, v_per_key - (SELECT count(*) FROM pgfence.jobs j
                                            WHERE j.kind = p_kind AND j.concurrency_key = k.key
                                              AND j.gated AND j.held_back IS NULL) AS free
                  FROM unnest(v_keys) AS k(key)) AS f
         CROSS JOIN LATERAL (
            SELECT s.id, s.priority, s.run_at, row_number() OVER () AS id_n
              FROM (SELECT id, priority, run_at FROM pgfence.jobs
                     WHERE kind = p_kind AND concurrency_key = f.key AND held_back = 'concurrency'
                     ORDER BY priority DESC, run_at, id
                     LIMIT v_per_key
                       FOR UPDATE SKIP LOCKED) AS s) AS c
         WHERE c.id_n <= f.free
    ), keyless AS (
        SELECT s.id, s.priority, s.run_at, row_number() OVER () AS n
          FROM (SELECT id, priority, run_at FROM pgfence.jobs
                 WHERE kind = p_kind AND concurrency_key IS NULL AND held_back = 'concurrency'
                 ORDER BY priority DESC, run_at, id
                 LIMIT v_free
                   FOR UPDATE SKIP LOCKED) AS s
    ), picked AS (
        SELECT id FROM (SELECT * FROM keyed UNION ALL SELECT * FROM keyless) AS c
         ORDER BY n, priority DESC, run_at, id
         LIMIT v_free
    ), admitted AS (
        UPDATE pgfence.jobs SET held_back = NULL WHERE id IN (SELECT id FROM picked)
        RETURNING queue)
    SELECT coalesce(sum(q.n), 0)::integer INTO v_n
      FROM (SELECT queue, count(*) AS n FROM admitted GROUP BY queue) q, pg_notify('pgfence_jobs', q.queue);
    PERFORM pgfence.rate_spent(p_kind, v_limit.rate_count, v_limit.rate_period, v_limit.rate_tat, v_n);
    RETURN v_n;
END;
$$;

-- Advance the kind's rate by the n starts just admitted (under its row's
-- lock, taken by admit).
CREATE FUNCTION pgfence.rate_spent(p_kind text, p_count integer, p_period double precision, p_tat timestamptz,
                                   p_n integer) RETURNS void
LANGUAGE sql AS $$
    UPDATE pgfence.limits
       SET rate_tat = greatest(coalesce(p_tat, clock_timestamp()), clock_timestamp())
                      + make_interval(secs => p_n * p_period / p_count)
     WHERE kind = p_kind AND p_count IS NOT NULL AND p_n > 0;
$$;

-- The (kind, key) pairs whose slots this transaction freed or whose jobs it
-- gated, noted in a transaction-local setting, one per line (kind TAB key;
-- no key: empty), each once.  A key holds no control character.
CREATE FUNCTION pgfence.note_admit(p_kind text, p_key text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_line  text := p_kind || E'\t' || coalesce(p_key, '');
    v_noted text := coalesce(current_setting('pgfence.admit', true), '');
BEGIN
    IF position(E'\n' || v_line || E'\n' IN E'\n' || v_noted) = 0 THEN
        PERFORM set_config('pgfence.admit', v_noted || v_line || E'\n', true);
    END IF;
END;
$$;

-- The per-key admission of many keys of one kind at once (a per-key limit
-- alone): the keys' locks in the order of their hashes, then one statement
-- that counts each key's holders and admits its next held jobs up to the
-- limit.  What admit() does for one key, in two statements for them all.
CREATE FUNCTION pgfence.admit_keys(p_kind text, p_keys text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_per_key integer;
    v_n       integer;
BEGIN
    SELECT per_key_concurrency INTO v_per_key FROM pgfence.limits WHERE kind = p_kind;
    IF v_per_key IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(p_kind), h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) AS k ORDER BY 1) AS locks;
    WITH wanted AS (
        SELECT k.key, v_per_key - (SELECT count(*) FROM pgfence.jobs j
                                    WHERE j.kind = p_kind AND j.concurrency_key = k.key
                                      AND j.gated AND j.held_back IS NULL) AS free
          FROM (SELECT DISTINCT key FROM unnest(p_keys) AS key) AS k
    ), picked AS (
        SELECT c.id
          FROM wanted w
         CROSS JOIN LATERAL (
            SELECT s.id, row_number() OVER () AS n
              FROM (SELECT id FROM pgfence.jobs
                     WHERE kind = p_kind AND concurrency_key = w.key AND held_back = 'concurrency'
                     ORDER BY priority DESC, run_at, id
                     LIMIT v_per_key
                       FOR UPDATE SKIP LOCKED) AS s) AS c
         WHERE c.n <= w.free
    ), admitted AS (
        UPDATE pgfence.jobs SET held_back = NULL WHERE id IN (SELECT id FROM picked)
        RETURNING queue)
    SELECT coalesce(sum(q.n), 0)::integer INTO v_n
      FROM (SELECT queue, count(*) AS n FROM admitted GROUP BY queue) q, pg_notify('pgfence_jobs', q.queue);
    RETURN v_n;
END;
$$;

-- Admit for every pair noted, then forget them: a kind with a concurrency
-- of its own once for all its keys, under its row's lock; a kind with a
-- per-key limit alone for all its keys at once.  Kinds in name order, so
-- two commits take their locks in one order.
CREATE FUNCTION pgfence.admit_noted() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_noted text := coalesce(current_setting('pgfence.admit', true), '');
    v_n     integer := 0;
    v_kind  record;
BEGIN
    IF v_noted = '' THEN
        RETURN 0;
    END IF;
    PERFORM set_config('pgfence.admit', '', true);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- A REPEATABLE READ or SERIALIZABLE transaction counts with its own
        -- snapshot, older than the limit's lock: it would miss admissions
        -- committed since.  Its pairs go to pgfence.admit_pending instead
        -- (an insert, which no concurrent change makes fail), for the next
        -- admit_due of a worker, in READ COMMITTED.
        INSERT INTO pgfence.admit_pending (kind, concurrency_key)
        SELECT DISTINCT split_part(line, E'\t', 1), nullif(split_part(line, E'\t', 2), '')
          FROM regexp_split_to_table(rtrim(v_noted, E'\n'), E'\n') AS line;
        RETURN 0;
    END IF;
    FOR v_kind IN SELECT n.kind, l.concurrency IS NOT NULL OR l.rate_count IS NOT NULL AS whole_kind,
                         array_agg(n.key) FILTER (WHERE n.key IS NOT NULL) AS keys
                    FROM (SELECT DISTINCT split_part(line, E'\t', 1) AS kind,
                                 nullif(split_part(line, E'\t', 2), '') AS key
                            FROM regexp_split_to_table(rtrim(v_noted, E'\n'), E'\n') AS line) n
                    LEFT JOIN pgfence.limits l ON l.kind = n.kind
                   GROUP BY n.kind, l.concurrency, l.rate_count
                   ORDER BY n.kind
    LOOP
        IF v_kind.whole_kind THEN
            v_n := v_n + pgfence.admit(v_kind.kind, NULL);
        ELSIF v_kind.keys IS NOT NULL THEN
            v_n := v_n + pgfence.admit_keys(v_kind.kind, v_kind.keys);
        END IF;
    END LOOP;
    RETURN v_n;
END;
$$;

-- A holder leaves: noted now, admitted for at commit (jobs_admit_*).
CREATE FUNCTION pgfence.jobs_note_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgfence.note_admit(OLD.kind, OLD.concurrency_key);
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgfence.jobs_admit_noted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgfence.admit_noted();
    RETURN NULL;
END;
$$;

-- A gated job that goes back to the queue (a retry, a put-back, a release)
-- gives its slot up and waits to be admitted again, so that a backoff does
-- not keep a slot.
CREATE FUNCTION pgfence.jobs_hold_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.held_back := CASE WHEN NEW.run_at > now() THEN 'scheduled' ELSE 'concurrency' END;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_hold_requeued BEFORE UPDATE ON pgfence.jobs
    FOR EACH ROW
    WHEN (OLD.gated AND OLD.status = 'running' AND NEW.status = 'queued' AND NEW.gated)
    EXECUTE FUNCTION pgfence.jobs_hold_requeued();

-- The WHEN clauses keep every ungated job's change free of these calls.
CREATE TRIGGER jobs_freed_update AFTER UPDATE ON pgfence.jobs
    FOR EACH ROW
    WHEN (OLD.gated AND OLD.held_back IS NULL AND NEW.held_back IS NOT NULL)
    EXECUTE FUNCTION pgfence.jobs_note_freed();
CREATE TRIGGER jobs_freed_delete AFTER DELETE ON pgfence.jobs
    FOR EACH ROW
    WHEN (OLD.gated AND OLD.held_back IS NULL)
    EXECUTE FUNCTION pgfence.jobs_note_freed();

CREATE CONSTRAINT TRIGGER jobs_admit_freed_update AFTER UPDATE ON pgfence.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((OLD.gated AND OLD.held_back IS NULL AND NEW.held_back IS NOT NULL) OR (NEW.gated AND NOT OLD.gated))
    EXECUTE FUNCTION pgfence.jobs_admit_noted();
CREATE CONSTRAINT TRIGGER jobs_admit_freed_delete AFTER DELETE ON pgfence.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.gated AND OLD.held_back IS NULL)
    EXECUTE FUNCTION pgfence.jobs_admit_noted();

-- New jobs of a limited kind: gated and held, then admitted at commit (the
-- gating update fires jobs_admit_freed_update).  One call per insert
-- statement; without any limit it reads one small table and returns.
CREATE FUNCTION pgfence.jobs_gate_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_pair record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgfence.limits
                    WHERE concurrency IS NOT NULL OR per_key_concurrency IS NOT NULL OR rate_count IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    FOR v_pair IN
        WITH gated AS (
            UPDATE pgfence.jobs j
               SET gated = true,
                   held_back = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'concurrency' END
              FROM added a
              JOIN pgfence.limits l ON l.kind = a.kind
             WHERE j.id = a.id AND j.status = 'queued' AND NOT j.gated
               AND (l.concurrency IS NOT NULL OR l.rate_count IS NOT NULL
                    OR (l.per_key_concurrency IS NOT NULL AND a.concurrency_key IS NOT NULL))
            RETURNING j.kind, j.concurrency_key)
        SELECT DISTINCT kind, concurrency_key FROM gated
    LOOP
        PERFORM pgfence.note_admit(v_pair.kind, v_pair.concurrency_key);
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_gate_inserted AFTER INSERT ON pgfence.jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgfence.jobs_gate_inserted();

-- After a kind's limits changed: gate its live jobs as they now stand
-- (held, to be admitted), free those no limit applies to any more, and
-- admit.  Holders above a lowered limit run to their end; none is stopped.
CREATE FUNCTION pgfence.gate(p_kind text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_conc    integer;
    v_per_key integer;
    v_rate    integer;
    v_pair    record;
BEGIN
    SELECT concurrency, per_key_concurrency, rate_count INTO v_conc, v_per_key, v_rate
      FROM pgfence.limits WHERE kind = p_kind;
    -- Jobs no limit applies to: ungated (and a held one free to be claimed).
    UPDATE pgfence.jobs SET gated = false, held_back = NULL
     WHERE kind = p_kind AND gated
       AND NOT (v_conc IS NOT NULL OR v_rate IS NOT NULL OR (v_per_key IS NOT NULL AND concurrency_key IS NOT NULL));
    -- Jobs a limit now applies to: running ones hold their slot, queued
    -- ones wait to be admitted.
    UPDATE pgfence.jobs
       SET gated = true,
           held_back = CASE WHEN status = 'running' THEN NULL
                            WHEN run_at > now() THEN 'scheduled' ELSE 'concurrency' END
     WHERE kind = p_kind AND NOT gated
       AND (v_conc IS NOT NULL OR v_rate IS NOT NULL OR (v_per_key IS NOT NULL AND concurrency_key IS NOT NULL));
    -- Admission for every key of the kind that has held jobs (a raised
    -- limit admits more), at this transaction's commit.
    FOR v_pair IN SELECT DISTINCT concurrency_key FROM pgfence.jobs WHERE kind = p_kind AND held_back = 'concurrency'
    LOOP
        PERFORM pgfence.note_admit(p_kind, CASE WHEN v_conc IS NULL AND v_rate IS NULL THEN v_pair.concurrency_key END);
    END LOOP;
    RETURN pgfence.admit_noted();
END;
$$;

-- Held jobs whose run_at came, and those of a kind whose rate lets more
-- start now: admitted if their limits allow.  Every worker calls it on its
-- reclaim rounds (about once a second) and when idle; it reads the held
-- jobs that were scheduled and are now due, and the limits with a rate.
CREATE FUNCTION pgfence.admit_due() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_pair record;
BEGIN
    -- Pairs a REPEATABLE READ or SERIALIZABLE commit left to admit.
    FOR v_pair IN
        WITH taken AS (DELETE FROM pgfence.admit_pending RETURNING kind, concurrency_key)
        SELECT DISTINCT kind, concurrency_key FROM taken
    LOOP
        PERFORM pgfence.note_admit(v_pair.kind, v_pair.concurrency_key);
    END LOOP;
    FOR v_pair IN
        WITH due AS (
            UPDATE pgfence.jobs SET held_back = 'concurrency'
             WHERE id IN (SELECT id FROM pgfence.jobs WHERE held_back = 'scheduled' AND run_at <= now()
                           ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
            RETURNING kind, concurrency_key)
        SELECT DISTINCT kind, concurrency_key FROM due
    LOOP
        PERFORM pgfence.note_admit(v_pair.kind, v_pair.concurrency_key);
    END LOOP;
    -- Kinds whose rate lets a start through now and that have jobs held.
    FOR v_pair IN SELECT l.kind FROM pgfence.limits l
                   WHERE l.rate_count IS NOT NULL AND (pgfence.rate_allows(l.rate_count, l.rate_period, l.rate_tat, 1)).allowed > 0
                     AND EXISTS (SELECT 1 FROM pgfence.jobs j WHERE j.kind = l.kind AND j.held_back = 'concurrency')
    LOOP
        PERFORM pgfence.note_admit(v_pair.kind, NULL);
    END LOOP;
    RETURN pgfence.admit_noted();
END;
$$;

-- enqueue with a concurrency key (0006's, one parameter more).  The old
-- signature goes: a second overload would make every call that leaves the
-- last parameters out ambiguous.
DROP FUNCTION pgfence.enqueue(text, jsonb, text, integer, timestamptz, integer, text, integer);
CREATE FUNCTION pgfence.enqueue(
    p_kind            text,
    p_payload         jsonb       DEFAULT '{}'::jsonb,
    p_queue           text        DEFAULT NULL,
    p_priority        integer     DEFAULT 0,
    p_run_at          timestamptz DEFAULT NULL,
    p_max_attempts    integer     DEFAULT NULL,
    p_dedupe_key      text        DEFAULT NULL,
    p_max_reclaims    integer     DEFAULT NULL,
    p_concurrency_key text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id    bigint;
    v_queue text;
BEGIN
    LOOP
        INSERT INTO pgfence.jobs
            (kind, payload, queue, priority, run_at, max_attempts, max_reclaims, dedupe_key, concurrency_key)
        VALUES
            (p_kind, coalesce(p_payload, '{}'::jsonb), p_queue,
             coalesce(p_priority, 0), coalesce(p_run_at, now()),
             p_max_attempts, p_max_reclaims, p_dedupe_key, p_concurrency_key)
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

-- all_jobs (0014) with the concurrency key and why a job waits; a
-- finished job keeps neither.
CREATE OR REPLACE VIEW pgfence.all_jobs AS
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       locked_by, lease_until, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, locked_by AS worker, NULL::jsonb AS result, concurrency_key, held_back
  FROM pgfence.jobs
UNION ALL
SELECT id, queue, kind, payload, status, attempt, max_attempts, reclaims, max_reclaims, priority, run_at,
       NULL::text, NULL::timestamptz, dedupe_key, last_error, created_at, started_at, finished_at, putbacks,
       last_traceback, worker, result, NULL::text, NULL::text
  FROM pgfence.job_history;
