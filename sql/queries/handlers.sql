-- name: insert_receipt
-- Record a sent receipt; runs inside the job's fenced transaction.
INSERT INTO pgfence.receipts (job_id, attempt, idempotency_key, order_id, email, amount_cents, sent_status)
VALUES (%(job_id)s, %(attempt)s, %(key)s, %(order_id)s, %(email)s, %(amount_cents)s, %(sent_status)s);

-- name: insert_effect
-- Record one effect of a job; runs inside the job's fenced transaction.
INSERT INTO pgfence.effects (job_id, attempt, idempotency_key, worker)
VALUES (%(job_id)s, %(attempt)s, %(key)s, %(worker)s);
