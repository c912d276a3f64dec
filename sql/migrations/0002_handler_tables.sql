-- Tables written by the bundled handlers.  Neither has a unique constraint on
-- the job: a double run shows up as two rows, which is how the demo, the
-- tests and the load-test audit see whether the fence held.

CREATE TABLE pgfence.receipts (
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
CREATE INDEX receipts_job_idx ON pgfence.receipts (job_id);

CREATE TABLE pgfence.effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          bigint      NOT NULL,
    attempt         integer     NOT NULL,
    idempotency_key text        NOT NULL,
    worker          text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX effects_job_idx ON pgfence.effects (job_id);
