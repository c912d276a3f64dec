-- Each failed attempt's traceback, beside its error text: pgfence.jobs'
-- last_traceback keeps only the last one, and a task API that lists every
-- attempt's error with its traceback (Django's TaskResult.errors) needs
-- them all.  Capped like last_traceback (pgfence.errortext.TRACEBACK_CAP);
-- NULL for an attempt that ended without one (a lease lost, a release, a
-- cancel) and for the rows written before this migration.
ALTER TABLE pgfence.job_attempts ADD COLUMN traceback text;
