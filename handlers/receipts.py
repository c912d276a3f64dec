"""send_receipt: the story pgfence exists for.

It renders a receipt (simulated slow work, ``payload.render_seconds``), sends
it through an HTTP email API with the job's idempotency key as the
``Idempotency-Key`` header, and records the receipt row through
``job.fenced_writes()`` into ``pgfence_examples.receipts`` (see
:mod:`pgfence.handlers.tables`), so the row is committed only by the attempt
that still owns the job.  The API's URL is the ``PGFENCE_EMAIL_API_URL`` setting.

Payload: ``{"order_id": "A-1", "email": "a@example.com", "amount_cents": 1250,
"render_seconds": 2}``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from pgfence import Job, PayloadRejected, handler
from pgfence.handlers.builtin import work_for
from pgfence.handlers.tables import INSERT_RECEIPT

DEFAULT_URL = "http://127.0.0.1:8025/send"


def api_url() -> str:
    return os.environ.get("PGFENCE_EMAIL_API_URL") or DEFAULT_URL


def _payload(job: Job) -> dict[str, Any]:
    payload = job.payload
    if not isinstance(payload, dict):
        raise PayloadRejected("payload must be a JSON object")
    if not payload.get("order_id") or not payload.get("email"):
        raise PayloadRejected("payload needs 'order_id' and 'email'")
    render = payload.get("render_seconds", 0)
    if isinstance(render, bool) or not isinstance(render, int | float) or render < 0:
        raise PayloadRejected(f"'render_seconds' must be a number >= 0, got {render!r}")
    return payload


def send(job: Job, payload: dict[str, Any]) -> int:
    """POST the receipt to the email API with the idempotency key; return the
    HTTP status.  The key is the same for every attempt of this job, so the
    API sends at most one email however often the request is repeated."""
    body = json.dumps({"to": payload["email"], "order_id": payload["order_id"],
                       "amount_cents": payload.get("amount_cents")}).encode()
    request = urllib.request.Request(
        api_url(), data=body, method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": job.idempotency_key,
                 "X-Pgfence-Attempt": str(job.attempt)},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@handler("send_receipt", max_attempts=5)
def send_receipt(job: Job) -> None:
    payload = _payload(job)
    work_for(job, float(payload.get("render_seconds", 0)))   # render
    job.check()                                              # last look before the effect
    status = send(job, payload)
    with job.fenced_writes() as writes:
        writes.execute(INSERT_RECEIPT, {
            "job_id": job.id, "attempt": job.attempt, "key": job.idempotency_key,
            "order_id": str(payload["order_id"]), "email": str(payload["email"]),
            "amount_cents": payload.get("amount_cents"), "sent_status": status,
        })
