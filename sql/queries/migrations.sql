-- name: migrations_bootstrap
-- The schema and the table that records applied migrations.
CREATE SCHEMA IF NOT EXISTS pgfence;
CREATE TABLE IF NOT EXISTS pgfence.migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_lock
-- Serialise concurrent migrators for the rest of the transaction.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migrations_table_exists
-- Whether the migrations table is there yet (a new database has none).
SELECT to_regclass('pgfence.migrations') IS NOT NULL;

-- name: migrations_applied
-- Versions already applied.
SELECT version FROM pgfence.migrations ORDER BY version;

-- name: migrations_record
-- Record one applied migration.
INSERT INTO pgfence.migrations (version, name) VALUES (%(version)s, %(name)s);
