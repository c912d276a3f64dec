-- Queue and kind names that a worker can serve.  `--queues` splits on
-- commas and strips spaces, and the settings read `none` as "no value": a
-- job put on the queue ' padded', 'a,b' or 'none' waited for ever.  Every
-- row inserted into pgfence.jobs, by pgfence.enqueue(), pgfence's Python
-- API or a plain INSERT alike, must now carry names of 1 to 128 ASCII
-- letters, digits, '_', '.', ':' or '-', starting with a letter or a digit,
-- and a queue other than 'none' (supervisor/names.py holds the same rule).
--
-- A trigger, not a CHECK constraint: a constraint, even NOT VALID, is
-- checked on every new row version, so the claim or completion of a job
-- enqueued before this migration under a name now refused (a unicode queue
-- that a worker does serve) would fail.  The trigger checks inserts, and
-- updates that set queue or kind, and leaves existing rows alone.  It is
-- named to fire after jobs_kind_options (triggers fire in name order), so
-- it sees the queue that trigger filled in.  Its WHEN clause keeps the
-- function call off every valid row: what a valid insert pays is two
-- regular-expression matches.
CREATE FUNCTION pgfence.jobs_names_invalid() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_what text;
    v_name text;
BEGIN
    IF NEW.kind IS NULL OR NEW.kind !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        v_what := 'kind';
        v_name := NEW.kind;
    ELSE
        v_what := 'queue';
        v_name := NEW.queue;
    END IF;
    RAISE EXCEPTION 'invalid % name %: must be 1 to 128 letters, digits, _ . : or -, starting with a letter or a digit, and not none for a queue',
                    v_what, coalesce(quote_literal(left(v_name, 200)), 'NULL')
        USING ERRCODE = 'check_violation';
END;
$$;

CREATE TRIGGER jobs_names_valid BEFORE INSERT OR UPDATE OF queue, kind ON pgfence.jobs
    FOR EACH ROW
    WHEN (NEW.kind !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'
          OR NEW.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'
          OR lower(NEW.queue) = 'none')
    EXECUTE FUNCTION pgfence.jobs_names_invalid();
