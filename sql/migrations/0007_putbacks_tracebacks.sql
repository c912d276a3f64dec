-- Put-backs, tracebacks, and the list of failed jobs.
--
-- putbacks: how many times a worker that did not know the job's kind handed
-- it back (a rolling deploy: the producer ships a kind before every worker
-- knows it).  A put-back is a claim, so it bumps attempt like any claim:
-- attempt is the fencing token and never goes back.  The attempts a job has
-- spent are therefore attempt - putbacks, and that is what the claim's
-- verdict, the error report and `pgfence retry` compare with max_attempts.
--
-- last_traceback: the Python traceback of the error in last_error (NULL
-- when that error has none, such as a timeout), capped in size by the worker.
--
-- Both columns have constant defaults, so adding them rewrites no row.
ALTER TABLE pgfence.jobs
    ADD COLUMN putbacks       integer NOT NULL DEFAULT 0,
    ADD COLUMN last_traceback text,
    ADD CONSTRAINT jobs_putbacks_check CHECK (putbacks >= 0 AND putbacks <= attempt);

-- `pgfence failed` lists the newest failed jobs first.  The index holds
-- failed jobs alone, so it costs nothing to the enqueue, claim and
-- completion of jobs that do not fail (a row version is added to a partial
-- index only when it matches the predicate), and the listing reads a few
-- entries whatever the number of finished jobs kept.
CREATE INDEX jobs_failed_idx ON pgfence.jobs (finished_at DESC NULLS LAST, id DESC)
    WHERE status = 'failed';
