"""handlers/receipts.py: render, send with the idempotency key, record through the fence."""

from __future__ import annotations

import pytest

from pgtools import job_row, scalar
from pgfence import enqueue, registry
from pgfence.tools.mailsink import MailSink
from pgfence.settings import Settings
from pgfence.worker.engine import Worker


@pytest.fixture
def sink(monkeypatch):
    sink = MailSink().start()
    monkeypatch.setenv("PGFENCE_EMAIL_API_URL", sink.url)
    yield sink
    sink.stop()


@pytest.fixture
def worker(dsn):
    registry.load(["pgfence.handlers.receipts"])
    w = Worker(dsn, Settings(lease=5, poll_interval=0.1, backoff_base=0.05, retention=None), name="test-w")
    yield w
    w.close()


def test_receipt_sent_once_with_the_idempotency_key(conn, sink, worker):
    job_id = enqueue(conn, "send_receipt", {"order_id": "A-1", "email": "a@example.com",
                                            "amount_cents": 1250, "render_seconds": 0.1})
    stats = worker.run(burst=True)
    assert stats.outcomes == {"done": 1}
    key = f"pgfence:job:{job_id}"
    assert dict(sink.deliveries) == {key: 1}
    rows = conn.execute("SELECT job_id, attempt, idempotency_key, order_id, email, amount_cents, sent_status "
                        "FROM pgfence_examples.receipts").fetchall()
    assert rows == [(job_id, 1, key, "A-1", "a@example.com", 1250, 200)]
    assert (job_row(conn, job_id)["status"], job_row(conn, job_id)["attempt"]) == ("done", 1)


def test_a_later_job_with_the_same_dedupe_key_sends_its_own_key(conn, sink, worker):
    """The dedupe key dedupes live jobs only: a job enqueued with it again
    after the first finished is a new job with its own idempotency key, so
    the email API does not drop its email as a repeat (before, both sent
    'pgfence:send_receipt:order-A-2' and one email was sent for two jobs)."""
    first = enqueue(conn, "send_receipt", {"order_id": "A-2", "email": "b@example.com"}, dedupe_key="order-A-2")
    assert enqueue(conn, "send_receipt", {"order_id": "A-2", "email": "b@example.com"},
                   dedupe_key="order-A-2") == first          # deduped while live
    worker.run(burst=True)
    second = enqueue(conn, "send_receipt", {"order_id": "A-2", "email": "b@example.com"}, dedupe_key="order-A-2")
    assert second != first
    worker.run(burst=True)
    assert dict(sink.deliveries) == {f"pgfence:job:{first}": 1, f"pgfence:job:{second}": 1}
    assert sink.sent == 2
    assert conn.execute("SELECT job_id, idempotency_key FROM pgfence_examples.receipts ORDER BY job_id").fetchall() == [
        (first, f"pgfence:job:{first}"), (second, f"pgfence:job:{second}")]


def test_payload_without_email_fails_at_once(conn, sink, worker):
    job_id = enqueue(conn, "send_receipt", {"order_id": "A-3"})
    stats = worker.run(burst=True)
    assert stats.outcomes == {"failed": 1}
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert row["last_error"] == "payload rejected: payload needs 'order_id' and 'email'"
    assert sink.requests == 0
    assert scalar(conn, "SELECT count(*) FROM pgfence_examples.receipts") == 0


def test_api_down_retries_then_fails_keeping_the_error(conn, monkeypatch, worker):
    # Nothing listens on port 1 of loopback: every send is refused.
    monkeypatch.setenv("PGFENCE_EMAIL_API_URL", "http://127.0.0.1:1/send")
    job_id = enqueue(conn, "send_receipt", {"order_id": "A-4", "email": "c@example.com"}, max_attempts=2)
    worker.run_once()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("queued", 1)
    assert row["last_error"].startswith("URLError:")
    conn.execute("UPDATE pgfence.jobs SET run_at = now() WHERE id = %s", (job_id,))
    worker.run_once()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("failed", 2)
    assert "Connection refused" in row["last_error"]
    assert scalar(conn, "SELECT count(*) FROM pgfence_examples.receipts") == 0
