-- The names rule of 0008, checked for a quarter of its cost.  PostgreSQL
-- compiles a bounded repeat such as {0,127} into an automaton of 127 copies
-- of its state, and each match builds its states anew: the two matches of
-- jobs_names_valid's WHEN took 4 us of the 8 us a row of a bulk insert
-- cost the server (100,000 rows of INSERT ... SELECT: 8.2 us a row, 3.6
-- with no trigger at all).  The same rule as an unbounded repeat and a
-- length: 4.2 us a row.  A name still matches
-- ^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$ exactly when it matches
-- ^[A-Za-z0-9][A-Za-z0-9_.:-]*$ and is at most 128 characters long, so the
-- trigger fires for the same rows, and its function (whose own test runs
-- only for a refused row) is unchanged.  Same name, so it still fires
-- after jobs_kind_options.
DROP TRIGGER jobs_names_valid ON pgfence.jobs;

CREATE TRIGGER jobs_names_valid BEFORE INSERT OR UPDATE OF queue, kind ON pgfence.jobs
    FOR EACH ROW
    WHEN (NEW.kind !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' OR length(NEW.kind) > 128
          OR NEW.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' OR length(NEW.queue) > 128
          OR lower(NEW.queue) = 'none')
    EXECUTE FUNCTION pgfence.jobs_names_invalid();
