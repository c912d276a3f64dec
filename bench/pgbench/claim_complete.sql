-- pgbench: one pgfence job per pgbench transaction, the statements a worker
-- with --batch 1 sends: pgfence's claim of one job (committed at once), then
-- the fenced completion of that attempt.
--
-- A template: bench/run.py fills in the two statements below from
-- sql/queries/jobs.sql (the claim wrapped so that its RETURNING rows are
-- stored by \gset: id, attempt, n), so this always runs the engine's current
-- SQL.  An empty queue claims nothing and completes id 0, which matches
-- nothing.
{{claim}}
{{complete}};
