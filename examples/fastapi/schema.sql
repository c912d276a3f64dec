-- The example's own tables (pgfence's are made by `pgfence migrate`).
CREATE TABLE orders (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email          text        NOT NULL,
    total_cents    integer     NOT NULL CHECK (total_cents > 0),
    receipt_job_id bigint,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- One receipt per order, written by the receipt job through its fence.
CREATE TABLE receipts (
    order_id   bigint      PRIMARY KEY REFERENCES orders (id),
    job_id     bigint      NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
