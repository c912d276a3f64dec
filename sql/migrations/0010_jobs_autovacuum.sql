-- Autovacuum settings of pgfence.jobs, the table every claim, renewal and
-- completion works on.  Each job leaves two or three dead row versions
-- behind it (its claim, its renewals, its completion, its deletion), so at
-- a few thousand jobs a second the table makes tens of thousands of dead
-- versions a second, and every one of them stays in the claim's and the
-- reclaim scan's index paths until a VACUUM removes it.  PostgreSQL's
-- defaults suit a table that grows slowly: they wait for a fifth of the
-- table to be dead and throttle the vacuum that follows.  A queue table
-- wants the opposite, and these settings are the common practice for one.
--
-- autovacuum_vacuum_scale_factor = 0 and a fixed threshold: the table's
-- size follows the queue depth, so a fraction of it grows exactly when a
-- backlog builds and vacuum is needed most.  A fixed count of dead
-- versions triggers the vacuum at any size.  Autovacuum still looks at a
-- database at most once per autovacuum_naptime (60 s by default, a server
-- setting no table option changes), so under load the threshold is always
-- passed and the naptime sets the pace.
ALTER TABLE pgfence.jobs SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- The same for inserts (PostgreSQL 13 and later): a burst of enqueues
-- with no claims yet (workers down, a backlog) gets vacuumed too, which
-- sets the visibility map and freezes those rows early, instead of
-- waiting for a fifth of the table to be new.
ALTER TABLE pgfence.jobs SET (autovacuum_vacuum_insert_scale_factor = 0,
                              autovacuum_vacuum_insert_threshold = 1000);

-- No cost-based throttling: by default an autovacuum sleeps 2 ms every
-- 200 cost units, so the vacuum of a table that churns lasts longer than
-- the churn it cleans up, and the dead versions made meanwhile wait for
-- the next round.  The table holds live jobs and the recently finished
-- ones, so an unthrottled vacuum of it is short.  With no delay the cost
-- limit plays no part, so it is not set.
ALTER TABLE pgfence.jobs SET (autovacuum_vacuum_cost_delay = 0);

-- Statistics follow the same fixed count: the table swings between empty
-- and a backlog of millions, and a plan made from the statistics of the
-- other extreme (a sequential scan of a table thought empty) is the slow
-- one.  ANALYZE samples at most 30,000 rows, so it stays cheap at any size.
ALTER TABLE pgfence.jobs SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 5000);

-- No truncation of the empty pages at the table's end: truncating takes
-- an ACCESS EXCLUSIVE lock, which stops every claim while it is held and,
-- replayed on a standby, stops the queries there too; and a queue table
-- that drained grows back with the next burst, into the same pages.
ALTER TABLE pgfence.jobs SET (vacuum_truncate = false);
