-- pgbench: a batch of pgfence jobs per pgbench transaction, the statements a
-- worker with --batch 50 sends for no-op handlers: pgfence's claim of up to
-- 50 jobs (committed at once), then complete_many, one statement that
-- completes every claimed attempt through the fence.
--
-- A template: bench/run.py fills in the two statements below from
-- sql/queries/jobs.sql (the claim wrapped so that its RETURNING rows are
-- stored by \gset as array literals: ids, attempts, n).
{{claim}}
{{complete_many}};
