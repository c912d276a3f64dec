"""The receipt job of examples/fastapi: ``pgfence run --handlers handlers``."""

from typing import Any

from pgfence import AsyncJob, handler


@handler("order_receipt", max_attempts=5, timeout=30)
async def order_receipt(job: AsyncJob) -> dict[str, Any]:
    order_id = job.payload["order_id"]
    # One transaction: the receipt row and the fenced completion. If this
    # attempt no longer owns the job (its lease ran out and another worker
    # took it), the completion finds no row, the receipt is rolled back and
    # LeaseLost is raised: one receipt per order, whoever runs the job.
    async with job.fenced() as conn:
        cur = await conn.execute("SELECT email, total_cents FROM orders WHERE id = %s", (order_id,))
        row = await cur.fetchone()
        if row is None:
            raise LookupError(f"order {order_id} not found")
        email, total_cents = row
        body = f"Order {order_id}: {total_cents / 100:.2f} EUR. {job.payload['note']}".strip()
        await conn.execute("INSERT INTO receipts (order_id, job_id, body) VALUES (%s, %s, %s)",
                           (order_id, job.id, body))
    # The job's result: GET /orders/{id} shows it.
    return {"order_id": order_id, "sent_to": email, "body": body}
