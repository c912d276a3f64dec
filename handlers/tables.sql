-- The tables the example handlers write, in a schema of their own: they are
-- no part of pgfence's schema, and `pgfence migrate` does not create them.
-- The demo, the load test, the benchmark and the tests create them with
-- pgfence.handlers.tables.create_tables (or `python -m pgfence.handlers.tables`).
--
-- Neither table has a unique constraint on the job: a double run shows up as
-- two rows, which is how the demo, the tests and the load-test audit see
-- whether the fence held.

CREATE SCHEMA IF NOT EXISTS pgfence_examples;

CREATE TABLE IF NOT EXISTS pgfence_examples.receipts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          bigint      NOT NULL,
    attempt         integer     NOT NULL,
    idempotency_key text        NOT NULL,
    order_id        text,
    email           text,
    amount_cents    bigint,
    sent_status     integer,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS receipts_job_idx ON pgfence_examples.receipts (job_id);

CREATE TABLE IF NOT EXISTS pgfence_examples.effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          bigint      NOT NULL,
    attempt         integer     NOT NULL,
    idempotency_key text        NOT NULL,
    worker          text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS effects_job_idx ON pgfence_examples.effects (job_id);
