-- The claim index split in two.  jobs_claim_idx held queued and running
-- jobs together, and running jobs sort first in it (their run_at is older
-- than that of any job still queued), so every claim stepped over every
-- running job of its queue, a heap visit each, before it reached the first
-- queued one: a claim's cost grew with the number of jobs running (400
-- running jobs made a no-op job cost PostgreSQL 39 us, 2,000 made it 88).
-- Now the claim reads queued jobs from an index that holds nothing else,
-- and looks for running jobs whose lease ran out in the other index only
-- once a second or so per worker (the claim's reclaim parameter).
--
-- lease_until stays out of every index, so that lease renewals remain HOT
-- updates (see 0003).  Building the indexes takes a lock that holds off
-- writes to pgfence.jobs for as long as the build runs.
CREATE INDEX jobs_queued_idx ON pgfence.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued';
CREATE INDEX jobs_running_idx ON pgfence.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'running';
DROP INDEX pgfence.jobs_claim_idx;
