"""An order API that enqueues each order's receipt job in the order's own
transaction: ``uvicorn app:app`` (PGFENCE_DSN names the database)."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from pgfence import ConfigError, aenqueue, aget_job
from pgfence.web import create_app

DSN = os.environ["PGFENCE_DSN"]
pool = AsyncConnectionPool(DSN, min_size=1, max_size=10, open=False)
# Open without a password: serve the app on loopback only, or set one.
dashboard = create_app(DSN, password=os.environ.get("PGFENCE_WEB_PASSWORD") or None)


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    await pool.open(wait=True)
    yield
    await pool.close()
    dashboard.state.dashboard.close()      # a mounted app gets no lifespan of its own: close its pool


app = FastAPI(lifespan=lifespan)
app.mount("/pgfence", dashboard)


class Order(BaseModel):
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    total_cents: int = Field(gt=0, le=10_000_000)
    note: str = Field(default="", max_length=200)     # printed on the receipt


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, int]:
    try:
        async with pool.connection() as conn, conn.transaction():
            cur = await conn.execute("INSERT INTO orders (email, total_cents) VALUES (%s, %s) RETURNING id",
                                     (order.email, order.total_cents))
            row = await cur.fetchone()
            assert row is not None
            order_id: int = row[0]
            # In the same transaction: the job exists if and only if the order does.
            job_id = await aenqueue(conn, "order_receipt", {"order_id": order_id, "note": order.note},
                                    dedupe_key=f"receipt:{order_id}")
            await conn.execute("UPDATE orders SET receipt_job_id = %s WHERE id = %s", (job_id, order_id))
    except ConfigError as exc:
        # pgfence refused the job (here: a note holding NUL, which jsonb
        # cannot store) after the order was inserted: both were rolled back.
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return {"id": order_id, "receipt_job_id": job_id}


@app.get("/orders/{order_id}")
async def read_order(order_id: int) -> dict[str, Any]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT email, total_cents, receipt_job_id FROM orders WHERE id = %s", (order_id,))
        row = await cur.fetchone()
        if row is None:
            raise HTTPException(status_code=404, detail=f"no order {order_id}")
        email, total_cents, job_id = row
        job = await aget_job(conn, job_id)
    receipt = None if job is None else {"job_id": job.id, "status": job.status, "attempt": job.attempt,
                                        "result": job.result, "last_error": job.last_error}
    return {"id": order_id, "email": email, "total_cents": total_cents, "receipt": receipt}
