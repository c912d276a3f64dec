"""The FastAPI recipe (examples/fastapi, docs/how-to/fastapi.md), for real:
the app under a uvicorn process and its receipt handler under a
``pgfence run`` process, both on the test's database, driven over HTTP.

An order and its receipt job commit in one transaction or not at all: bad
input is refused before the transaction (422, nothing inserted), and a job
pgfence refuses after the order's INSERT ran (a note holding NUL) rolls the
order back with it (422, nothing left but the used id).  The worker runs
the job once, its receipt row committed with the fenced completion, its
return value stored as the job's result.  The page shows the example's
files as they are (checked here), so it cannot drift from what this test
runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from docexamples import collect
from pgtools import ROOT, job_row, scalar, wait_for

pytestmark = pytest.mark.server_only

EXAMPLE = ROOT / "examples" / "fastapi"
PAGE = ROOT / "docs" / "how-to" / "fastapi.md"


class Process:
    """A process of the example, started in its folder; its output in a file."""

    def __init__(self, label: str, args: list[str], dsn: str, tmp_path: Path) -> None:
        self.label = label
        self.log_path = tmp_path / f"{label}.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PGFENCE_") and k not in ("DATABASE_URL", "PYTHONPATH")}
        env.update(PGFENCE_DSN=dsn, PGFENCE_METRICS_PORT="0", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", *args], cwd=EXAMPLE, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, text=True)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait(self, condition, message: str, timeout: float = 20):
        """wait_for, failing with the log if the process exits or the deadline passes."""
        def check():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.label} exited {self.proc.returncode}:\n{self.log()}")
            return condition()
        try:
            return wait_for(check, timeout=timeout, message=message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.label} log ---\n{self.log()}") from None

    def terminate(self) -> int:
        """SIGTERM, then its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.label} still running 30 s after SIGTERM:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def started(dsn: str, tmp_path: Path) -> Iterator[tuple[Process, Process, str]]:
    """The example's schema on the test's database, then the worker and the
    app (on a port the kernel chose, read from uvicorn's log); both killed
    afterwards if the test did not stop them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute((EXAMPLE / "schema.sql").read_text())
    worker = Process("worker", ["pgfence", "run", "--handlers", "handlers", "--workers", "1"], dsn, tmp_path)
    web = Process("uvicorn", ["uvicorn", "app:app", "--host", "127.0.0.1", "--port", "0"], dsn, tmp_path)
    try:
        port = web.wait(lambda: (m := re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", web.log()))
                        and m.group(1), "uvicorn's port")
        yield worker, web, f"http://127.0.0.1:{port}"
    finally:
        web.kill()
        worker.kill()


def counts(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(orders, receipts, jobs live or finished)."""
    row = conn.execute("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM receipts),"
                       " (SELECT count(*) FROM pgfence.all_jobs)").fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_an_order_and_its_receipt_job_commit_together_and_the_worker_runs_it_once(dsn, started):
    worker, web, base = started
    with httpx.Client(base_url=base, timeout=10) as http, psycopg.connect(dsn, autocommit=True) as conn:
        # Bad input: refused by the model before any transaction.
        response = http.post("/orders", json={"email": "not-an-address", "total_cents": 0})
        assert response.status_code == 422, response.text
        assert [(e["loc"], e["type"]) for e in response.json()["detail"]] == [
            (["body", "email"], "string_pattern_mismatch"), (["body", "total_cents"], "greater_than")]
        assert counts(conn) == (0, 0, 0)
        assert scalar(conn, "SELECT is_called FROM orders_id_seq") is False

        # The INSERT runs, then aenqueue refuses the payload: both roll back.
        response = http.post("/orders", json={"email": "ada@example.com", "total_cents": 1250, "note": "a\u0000b"})
        assert response.status_code == 422, response.text
        assert response.json() == {
            "detail": "invalid payload: a string holds a NUL character (\\u0000), which jsonb cannot store"}
        assert counts(conn) == (0, 0, 0)
        # The order's id was drawn (a sequence is not transactional): the INSERT did run.
        assert conn.execute("SELECT last_value, is_called FROM orders_id_seq").fetchone() == (1, True)

        response = http.post("/orders", json={"email": "ada@example.com", "total_cents": 1250, "note": "Thank you!"})
        assert response.status_code == 201, response.text
        created = response.json()
        assert created.keys() == {"id", "receipt_job_id"} and created["id"] == 2
        order_id, job_id = created["id"], created["receipt_job_id"]

        def finished():
            body = http.get(f"/orders/{order_id}").json()
            return body if body["receipt"]["status"] == "done" and body["receipt"]["result"] is not None else None

        order = worker.wait(finished, "the receipt job done, its result stored")
        body = "Order 2: 12.50 EUR. Thank you!"
        result = {"order_id": 2, "sent_to": "ada@example.com", "body": body}
        assert order == {"id": 2, "email": "ada@example.com", "total_cents": 1250,
                         "receipt": {"job_id": job_id, "status": "done", "attempt": 1, "result": result,
                                     "last_error": None}}
        assert http.get("/orders/3").status_code == 404

        # The rows: one order, one receipt written by the job, the job done at attempt 1.
        assert conn.execute("SELECT id, email, total_cents, receipt_job_id FROM orders").fetchall() == [
            (2, "ada@example.com", 1250, job_id)]
        assert conn.execute("SELECT order_id, job_id, body FROM receipts").fetchall() == [(2, job_id, body)]
        assert counts(conn) == (1, 1, 1)
        job = job_row(conn, job_id)
        assert (job["kind"], job["queue"], job["status"], job["attempt"], job["payload"], job["dedupe_key"],
                job["result"], job["last_error"]) == (
            "order_receipt", "default", "done", 1, {"order_id": 2, "note": "Thank you!"}, "receipt:2", result, None)
        assert scalar(conn, "SELECT count(*) FROM pgfence.job_attempts WHERE job_id = %s", (job_id,)) == 0

        # The dashboard, mounted under /pgfence, open on loopback.
        overview = http.get("/pgfence/")
        assert overview.status_code == 200, overview.text
        page = http.get(f"/pgfence/jobs/{job_id}")
        assert page.status_code == 200, page.text
        assert "order_receipt" in page.text and "receipt:2" in page.text

    # SIGTERM: pgfence run exits 0; uvicorn shuts down cleanly, then ends
    # by the signal it caught (-15), as it always does.
    assert worker.terminate() == 0, worker.log()
    assert web.terminate() == -signal.SIGTERM, web.log()
    log = web.log()
    assert "Application shutdown complete." in log and "Traceback" not in log and "ERROR" not in log, log
    assert "Traceback" not in worker.log(), worker.log()


def test_the_page_shows_the_example_files_as_they_are():
    """docs/how-to/fastapi.md's file blocks are the example's files, byte for
    byte (tests/test_docs_examples.py runs the page's blocks)."""
    shown = {e.file: e.code for e in collect(PAGE) if e.file}
    assert sorted(shown) == ["app.py", "handlers.py", "schema.sql"]
    for name, code in shown.items():
        assert code == (EXAMPLE / name).read_text(), f"{PAGE.name}'s {name} differs from examples/fastapi/{name}"

