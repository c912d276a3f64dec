"""Bulk actions of the dashboard in the background (pgfence.web.bulk,
migration 0013): the POST answers at once, a runner acts a batch per
transaction with its progress committed in the same transaction, a cancel
stops it between batches, a runner that dies is taken over without acting
on a job twice, and every action is audited.  Real PostgreSQL, the real app
(starlette's TestClient), and the dashboard served by uvicorn as a process
of its own where one must die (tests/web_serve.py).

A job's row lock held by the test (an open transaction) stops the runner
exactly where the test wants it: in the middle of a batch, after the
batches before it committed."""

from __future__ import annotations

import base64
import html as htmllib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from pgtools import ROOT, env_for, scalar, wait_for

pytest.importorskip("starlette")
import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from pgfence.store import bulk as bulk_store  # noqa: E402
from pgfence.web.app import create_app  # noqa: E402

SCRIPT = "<script>alert(1)</script>"
RUNNER = "pgfence-web-bulk"

_apps = []


@pytest.fixture(autouse=True)
def _close_dashboards():
    yield
    while _apps:
        _apps.pop().state.dashboard.close()


def client(dsn: str, **options) -> TestClient:
    app = create_app(dsn, **options)
    _apps.append(app)
    return TestClient(app, follow_redirects=False)


def add_failed(conn, n: int, *, queue: str = "bulk", error: str = "upstream 503") -> list[int]:
    """``n`` failed jobs in history, as a final failure leaves them; their ids, newest first."""
    rows = conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, last_error, attempt, max_attempts, started_at)
        SELECT 'failed', %s, 'noop', %s, 1, 1, now() FROM generate_series(1, %s)
        RETURNING id""", (queue, error, n)).fetchall()
    return sorted((r[0] for r in rows), reverse=True)


def confirm_form(c, **params) -> dict[str, str]:
    """The hidden fields of the bulk confirmation's form (its CSRF token included)."""
    page = c.get("/jobs/bulk", params=params)
    assert page.status_code == 200, page.text
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text.split('id="confirm"')[1])
    return {name: htmllib.unescape(value) for name, value in fields}


def action_row(conn, action_id: int) -> bulk_store.BulkAction:
    row = bulk_store.get(conn, action_id)
    assert row is not None
    return row


def text_of(page: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    assert match, f"no #{element_id} in the page"
    return htmllib.unescape(match.group(1)).strip()


def waiting_on_locks(conn, application_name: str = RUNNER) -> int:
    return scalar(conn, """SELECT count(*) FROM pg_stat_activity
                            WHERE datname = current_database() AND application_name = %s
                              AND wait_event_type = 'Lock'""", (application_name,))


def hold(dsn: str, job_id: int) -> psycopg.Connection:
    """A transaction that holds ``job_id``'s history row until it commits."""
    holder = psycopg.connect(dsn)
    holder.execute("SELECT 1 FROM pgfence.job_history WHERE id = %s FOR UPDATE", (job_id,))
    return holder


def started_id(response) -> int:
    assert response.status_code == 303, response.text
    match = re.fullmatch(r"/operations/(\d+)", response.headers["location"])
    assert match, response.headers["location"]
    return int(match.group(1))


def retried(conn, ids: list[int]) -> list[tuple[int, int]]:
    """(attempt, max_attempts) of each of ``ids`` queued again, by id."""
    return conn.execute("SELECT attempt, max_attempts FROM pgfence.jobs WHERE id = ANY(%s) AND status = 'queued' "
                        "ORDER BY id", (ids,)).fetchall()


# -- the tests ---------------------------------------------------------------------------


def test_a_bulk_retry_returns_at_once_and_finishes_with_exact_counts_and_its_audit(dsn, conn):
    target = add_failed(conn, 1234, queue="mail")
    done = conn.execute("""INSERT INTO pgfence.job_history (status, queue, kind, attempt, started_at)
                           SELECT 'done', 'mail', 'noop', 1, now() FROM generate_series(1, 20) RETURNING id""").fetchall()
    elsewhere = add_failed(conn, 7, queue="billing")
    basic = "Basic " + base64.b64encode(b"ops:pw").decode()
    with client(dsn, password="pw", bulk_batch=100) as c:
        c.headers["Authorization"] = basic
        form = confirm_form(c, action="retry", queue="mail", status="failed")
        assert form["upto"] == str(target[0])
        [late] = add_failed(conn, 1, queue="mail")
        # The newest job held: the runner stops in its first batch, and the
        # POST has already answered.
        holder = hold(dsn, target[0])
        try:
            began = time.monotonic()
            response = c.post("/jobs/bulk", data=form)
            answered = time.monotonic() - began
            action_id = started_id(response)
            page = c.get(response.headers["location"]).text
            assert text_of(page, "flash") == f"operation {action_id} started: retry every job matching the filter"
            assert text_of(page, "op-state") == "running" and '<meta http-equiv="refresh" content="2">' in page
            assert 'id="cancel-op"' in page
            assert action_row(conn, action_id).acted == 0 and retried(conn, target) == []
            wait_for(lambda: waiting_on_locks(conn) == 1, message="the runner's first batch waiting on the held job")
        finally:
            holder.commit()
            holder.close()
        finished = wait_for(lambda: (r := action_row(conn, action_id)).state == "done" and r, message="done")
        page = c.get(f"/operations/{action_id}").text
        listing = c.get("/operations").text
    assert answered < 2.0
    assert (finished.action, finished.filter, finished.upto, finished.matched, finished.acted, finished.left_alone,
            finished.batches, finished.cancelled_by, finished.last_error) == \
        ("retry", {"queue": "mail", "status": "failed"}, target[0], 1234, 1234, 0, 13, None, None)
    assert finished.started_by == "ops from testclient" and finished.finished_at >= finished.started_at
    # Each retried once: queued again with one attempt more than it spent.
    assert retried(conn, target) == [(1, 2)] * 1234
    assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (late,)) == "failed"
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE id = ANY(%s) AND status = 'failed'",
                  (elsewhere,)) == 7
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE id = ANY(%s)", ([d[0] for d in done],)) == 20
    # The page once done: no reload, no Cancel; the counts, who and when.
    assert "http-equiv" not in page and 'id="cancel-op"' not in page
    assert [text_of(page, i) for i in ("op-state", "op-processed", "op-matched", "op-acted", "op-left-alone",
                                       "op-batches", "op-started-by")] == \
        ["done", "1234", "1234", "1234", "0", "13", "ops from testclient"]
    row = re.search(rf'<tr data-operation-id="{action_id}" class="state-done">(.*?)</tr>', listing, re.S).group(1)
    cells = [htmllib.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[:8] == [str(action_id), "retry", "queue=mail status=failed", "done", "1234", "1234", "0",
                         "ops from testclient"]


def test_progress_shows_mid_way_and_a_cancel_stops_between_batches(dsn, conn):
    failed = add_failed(conn, 1000)
    holder = hold(dsn, failed[349])               # in the 4th batch of 100
    try:
        with client(dsn, bulk_batch=100) as c:
            action_id = started_id(c.post("/jobs/bulk", data=confirm_form(c, action="retry", queue="bulk")))
            wait_for(lambda: action_row(conn, action_id).acted == 300 and waiting_on_locks(conn) == 1,
                     message="three batches committed, the fourth waiting")
            page = c.get(f"/operations/{action_id}").text
            assert [text_of(page, i) for i in ("op-state", "op-processed", "op-matched", "op-acted", "op-batches")] \
                == ["running", "300", "1000", "300", "3"]
            assert '<progress max="1000" value="300">' in page
            token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
            # The cancel waits for the batch under way (it holds the row), then wins.
            answers = []
            cancelling = threading.Thread(target=lambda: answers.append(
                c.post(f"/operations/{action_id}/cancel", data={"csrf_token": token})))
            cancelling.start()
            wait_for(lambda: waiting_on_locks(conn, "pgfence-web") == 1, message="the cancel waiting for the batch")
            holder.commit()
            cancelling.join(timeout=30)
            runner = c.app.state.dashboard.runner
            wait_for(lambda: runner.current is None, message="the runner letting the action go")
            page = c.get(f"/operations/{action_id}").text
    finally:
        holder.close()
    [response] = answers
    assert response.status_code == 303 and response.headers["location"] == f"/operations/{action_id}"
    row = action_row(conn, action_id)
    assert (row.state, row.acted, row.batches, row.left_alone, row.cancelled_by) == \
        ("cancelled", 400, 4, 0, "pgfence web from testclient")
    assert text_of(page, "flash") == f"cancelled operation {action_id}: 400 job(s) retried before it stopped"
    assert text_of(page, "op-cancelled-by") == "pgfence web from testclient"
    assert "http-equiv" not in page and 'id="cancel-op"' not in page
    # Exactly the four batches' jobs were retried: the newest 400.
    assert [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs ORDER BY id DESC")] == failed[:400]
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE status = 'failed'") == 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_runners_action_is_taken_over_by_another_dashboard_and_no_job_is_acted_on_twice(dsn, conn):
    failed = add_failed(conn, 1000)
    port = _free_port()
    web = subprocess.Popen([sys.executable, str(ROOT / "tests" / "web_serve.py"), dsn, str(port), "100"],
                           env=env_for(dsn), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    holder = hold(dsn, failed[349])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            def up():
                try:
                    return http.get("/").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, message="pgfence web answering")
            action_id = started_id(http.post("/jobs/bulk", data=confirm_form(http, action="retry", status="failed")))
        wait_for(lambda: action_row(conn, action_id).acted == 300 and waiting_on_locks(conn) == 1,
                 message="three batches committed, the fourth waiting")
        web.send_signal(signal.SIGKILL)
        web.communicate(timeout=10)
    finally:
        holder.commit()
        holder.close()
    # The dead process's session rolls its batch back once it finds its client gone.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND application_name = %s", (RUNNER,)) == 0, message="the dead runner's session gone")
    assert action_row(conn, action_id).acted == 300 and len(retried(conn, failed)) == 300
    with client(dsn, bulk_batch=100) as c:
        c.get("/")
        finished = wait_for(lambda: (r := action_row(conn, action_id)).state == "done" and r, message="taken over")
        owner = c.app.state.dashboard.runner.owner
    assert (finished.matched, finished.acted, finished.left_alone, finished.batches, finished.owner) == \
        (1000, 1000, 0, 10, owner)
    # Every job retried once, none twice (a batch done twice would find its
    # jobs queued already and leave them alone, and they would not be here).
    assert retried(conn, failed) == [(1, 2)] * 1000
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history") == 0


def test_a_live_runner_keeps_its_action_and_a_dead_or_expired_one_loses_it(dsn, conn):
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        action_id = bulk_store.create(conn, action="retry", fields={}, upto=10, batch=5, by="test")
        assert bulk_store.claim(a, owner="a", lease=3600) == action_id
        assert bulk_store.claim(b, owner="b", lease=3600) is None            # a's lease and session live
        assert bulk_store.claim(a, owner="a", lease=3600) == action_id       # a reconnecting takes it back
        conn.execute("UPDATE pgfence.bulk_actions SET lease_until = now() - interval '1 second'")
        with b.transaction():
            assert bulk_store.claim(b, owner="b", lease=3600) == action_id   # a's lease ran out
            assert bulk_store.lock(b, action_id, owner="b") is not None
            # Locked by b's batch: skipped, never waited for.
            assert bulk_store.claim(a, owner="a", lease=3600) is None
        with a.transaction():
            assert bulk_store.lock(a, action_id, owner="a") is None           # a lost it: its batch stops
    # b's session gone: taken over at once, its lease notwithstanding.
    wait_for(lambda: bulk_store.claim(conn, owner="c", lease=3600) == action_id, timeout=10,
             message="the action of a closed session taken over")
    assert action_row(conn, action_id).owner == "c"
    assert bulk_store.release(conn, owner="c") == 1 and action_row(conn, action_id).owner is None


def test_bad_input_csrf_and_escaping(dsn, conn):
    target = add_failed(conn, 3, error=f"boom {SCRIPT}")
    with client(dsn, bulk_batch=100) as c:
        form = confirm_form(c, action="retry", error=SCRIPT)
        for bad, message in (({"action": "explode"}, "unknown action"),
                             ({"status": "lost"}, "status: one of queued, running, done, failed, cancelled, not 'lost'"),
                             ({"upto": "12; drop"}, "upto: not a job id: '12; drop'")):
            response = c.post("/jobs/bulk", data=form | bad)
            assert response.status_code == 400, bad
            assert htmllib.unescape(re.search(r'<p id="error" class="error">(.*?)</p>', response.text).group(1)) \
                == message
        for data in ({k: v for k, v in form.items() if k != "csrf_token"}, form | {"csrf_token": "0" * 64}):
            assert c.post("/jobs/bulk", data=data).status_code == 403
        assert scalar(conn, "SELECT count(*) FROM pgfence.bulk_actions") == 0
        assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE status = 'failed'") == 3

        c.headers["Authorization"] = "Basic " + base64.b64encode(b'<b onmouseover="x">ops</b>:').decode()
        action_id = started_id(c.post("/jobs/bulk", data=form))
        wait_for(lambda: action_row(conn, action_id).state == "done", message="done")
        pages = [c.get(f"/operations/{action_id}").text, c.get("/operations").text]
        # An action no runner may take (a live owner holds it) for the cancel's CSRF check.
        held = bulk_store.create(conn, action="delete", fields={}, upto=1, batch=1, by="test")
        conn.execute("UPDATE pgfence.bulk_actions SET owner = 'elsewhere', owner_pid = pg_backend_pid(), "
                     "lease_until = now() + interval '1 hour' WHERE id = %s", (held,))
        assert c.post(f"/operations/{held}/cancel", data={}).status_code == 403
        assert c.post(f"/operations/{held}/cancel", data={"csrf_token": "0" * 64}).status_code == 403
        assert action_row(conn, held).state == "running"
        assert c.get("/operations/999999").status_code == 404
    assert retried(conn, target) == [(1, 2)] * 3
    assert action_row(conn, action_id).filter == {"error": SCRIPT}
    for page in pages:
        assert SCRIPT not in page and "<b onmouseover" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b onmouseover=&#34;x&#34;&gt;ops&lt;/b&gt;" in page
