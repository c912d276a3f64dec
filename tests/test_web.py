"""The web dashboard without a browser: the pure helpers alone, then the real
app (starlette's TestClient) on a real database, and ``pgfence web`` as a
subprocess for what the command itself decides (its address, its password,
the DSN it prints)."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import re
import socket
import time

import psycopg
import pytest
from pgtools import env_for, scalar, spawn, wait_for
from pgtools import pgfence as run_pgfence

pytest.importorskip("starlette")
import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from pgfence.store import web as store  # noqa: E402
from pgfence.web import auth  # noqa: E402
from pgfence.web.app import create_app  # noqa: E402
from pgfence.web.views import attempt_lines, parse_filter  # noqa: E402

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'


# -- helpers ---------------------------------------------------------------------------


_apps = []


@pytest.fixture(autouse=True)
def _close_dashboards():
    """Each dashboard's pool closed at the end of its test."""
    yield
    while _apps:
        _apps.pop().state.dashboard.close()


def client(dsn: str, **options) -> TestClient:
    app = create_app(dsn, **options)
    _apps.append(app)
    return TestClient(app, follow_redirects=False)


def add_finished(conn, n: int, *, status: str = "failed", queue: str = "default", kind: str = "noop",
                 error: str | None = "boom", dedupe_key: str | None = None, payload: object = None) -> list[int]:
    """``n`` finished jobs written to history as pgfence's statements would; their ids, ascending."""
    rows = conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, last_error, dedupe_key, payload, attempt, started_at)
        SELECT %(status)s, %(queue)s, %(kind)s, %(error)s, %(dedupe_key)s, %(payload)s::jsonb, 1, now()
          FROM generate_series(1, %(n)s)
        RETURNING id""", {"status": status, "queue": queue, "kind": kind, "error": error,
                          "dedupe_key": dedupe_key, "payload": json.dumps(payload or {}), "n": n}).fetchall()
    return sorted(r[0] for r in rows)


def add_live(conn, n: int, *, status: str = "queued", queue: str = "default", kind: str = "noop",
             dedupe_key: str | None = None) -> list[int]:
    rows = conn.execute("""
        INSERT INTO pgfence.jobs (status, queue, kind, dedupe_key, attempt, locked_by, lease_until, started_at)
        SELECT %(status)s, %(queue)s, %(kind)s, %(dedupe_key)s,
               CASE WHEN %(status)s = 'running' THEN 1 ELSE 0 END,
               CASE WHEN %(status)s = 'running' THEN 'host:1:w' END,
               CASE WHEN %(status)s = 'running' THEN now() + interval '5 minutes' END,
               CASE WHEN %(status)s = 'running' THEN now() END
          FROM generate_series(1, %(n)s)
        RETURNING id""", {"status": status, "queue": queue, "kind": kind, "dedupe_key": dedupe_key, "n": n})
    return sorted(r[0] for r in rows.fetchall())


def job_ids(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', page)]


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


def next_link(page: str) -> str | None:
    match = re.search(r'<a id="next-page" href="([^"]+)"', page)
    return htmllib.unescape(match.group(1)) if match else None


def flash(page: str) -> str | None:
    match = re.search(r'<p id="flash" class="flash">(.*?)</p>', page, re.S)
    return htmllib.unescape(match.group(1)) if match else None


# -- pure logic (no database) ------------------------------------------------------------


def test_filters_are_parsed_and_bad_fields_reported():
    where, problems = parse_filter({"queue": " mail ", "kind": "", "status": "failed", "id": "12",
                                    "dedupe_key": "k:1", "error": "Time"})
    assert where == store.JobFilter(queue="mail", kind=None, status="failed", id=12, dedupe_key="k:1", error="Time")
    assert problems == []
    where, problems = parse_filter({"id": "12; drop", "status": "lost"})
    assert where == store.JobFilter()
    assert problems == ["status: one of queued, running, done, failed, cancelled, not 'lost'",
                        "id: not a job id: '12; drop'"]


def _detail(status: str, attempt: int, **extra) -> store.JobDetail:
    now = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    values = dict(id=7, queue="q", kind="k", status=status, payload={}, attempt=attempt, max_attempts=5, reclaims=0,
                  max_reclaims=3, priority=0, putbacks=0, run_at=now, created_at=now, started_at=now,
                  finished_at=now if status in ("done", "failed", "cancelled") else None, lease_until=None,
                  worker="h:1:a", dedupe_key=None, last_error=None, last_traceback=None, result=None, now=now)
    values.update(extra)
    return store.JobDetail(**values)


def test_attempt_lines_add_the_job_row_to_the_recorded_attempts():
    t = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    errors = [store.AttemptRow(1, "h:1:a", t, t, "error", "ValueError: one"),
              store.AttemptRow(2, "h:1:b", t, t, "error", "ValueError: two")]
    lines = attempt_lines(_detail("done", 3), errors)
    assert [(a.attempt, a.outcome, a.detail) for a in lines] == [
        (1, "error", "ValueError: one"), (2, "error", "ValueError: two"), (3, "done", None)]
    assert [(a.attempt, a.outcome) for a in attempt_lines(_detail("running", 3), errors)][-1] == (3, "running")
    assert [(a.attempt, a.outcome) for a in attempt_lines(_detail("queued", 2), errors)][-1] == (3, "queued")
    # A final failure recorded as its attempt's row is not shown twice; one
    # that left no row (a claim's verdict) gets its line from the job.
    assert [(a.attempt, a.outcome) for a in attempt_lines(_detail("failed", 2, last_error="x"), errors)] == \
        [(1, "error"), (2, "error")]
    assert [(a.attempt, a.outcome, a.detail) for a in attempt_lines(_detail("failed", 3, last_error="x"), errors)][-1] \
        == (3, "error", "x")
    assert attempt_lines(_detail("cancelled", 0), []) == []


def test_signer_tokens_and_cookies():
    signer, other = auth.Signer(b"k" * 32), auth.Signer(b"j" * 32)
    nonce = signer.new_nonce()
    token = signer.csrf_token(nonce)
    assert signer.csrf_valid(nonce, token)
    assert not signer.csrf_valid(nonce, other.csrf_token(nonce))
    assert not signer.csrf_valid(signer.new_nonce(), token)
    assert not signer.csrf_valid(None, token) and not signer.csrf_valid(nonce, None) and not signer.csrf_valid(nonce, "")
    cookie = signer.session_cookie(now=1000.0)
    assert signer.session_valid(cookie, now=1000.0 + auth.SESSION_SECONDS - 1)
    assert not signer.session_valid(cookie, now=1000.0 + auth.SESSION_SECONDS)
    assert not other.session_valid(cookie, now=1000.0)
    assert not signer.session_valid("99999999999." + "0" * 64)
    assert signer.flash_message(signer.flash_cookie("retried 3 job(s) <b>")) == "retried 3 job(s) <b>"
    assert other.flash_message(signer.flash_cookie("x")) is None


def test_login_sends_only_to_paths_of_the_dashboard():
    from pgfence.web.views import Views

    assert [Views._next(v) for v in ("/jobs?status=failed", "/", "//evil.example/", "/\\evil.example",
                                      "/\t/evil.example", "https://evil.example/", "", None, "jobs")] == \
        ["/jobs?status=failed", "/", "/", "/", "/", "/", "/", "/", "/"]


def test_loopback_and_basic_credentials():
    assert [auth.is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost")] == [True] * 5
    assert [auth.is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com", "")] == [False] * 5
    import base64

    header = "Basic " + base64.b64encode(b"anyone:s3cret:with:colons").decode()
    assert auth.basic_password(header) == "s3cret:with:colons"
    assert auth.basic_password("Bearer x") is None and auth.basic_password("Basic !!!") is None


# -- the app on a real database ----------------------------------------------------------


def test_job_list_filters_and_keyset_pages(dsn, conn):
    old_failed = add_finished(conn, 30, queue="mail", kind="send", error="SMTP timeout")
    done = add_finished(conn, 40, status="done", queue="mail", kind="send", error=None)
    queued = add_live(conn, 60, queue="mail", kind="send")
    other = add_finished(conn, 5, queue="billing", kind="charge", error="card declined", dedupe_key="order:42")
    everything = sorted(old_failed + done + queued + other, reverse=True)
    with client(dsn) as c:
        page = c.get("/jobs").text
        assert job_ids(page) == everything[:50]
        page2 = c.get(next_link(page)).text
        assert job_ids(page2) == everything[50:100]
        page3 = c.get(next_link(page2)).text
        assert job_ids(page3) == everything[100:135]
        assert next_link(page3) is None and 'id="next-page"' not in page3

        def ids(**params) -> list[int]:
            return job_ids(c.get("/jobs", params=params).text)

        assert ids(queue="billing") == sorted(other, reverse=True)
        assert ids(queue="mail", status="failed") == sorted(old_failed, reverse=True)
        assert ids(kind="send", status="queued") == sorted(queued, reverse=True)[:50]
        assert ids(id=str(done[3])) == [done[3]]
        assert ids(dedupe_key="order:42") == sorted(other, reverse=True)
        assert ids(error="smtp TIME") == sorted(old_failed, reverse=True)
        assert ids(error="%") == [] and ids(queue="nope") == []
        # Filters carry over to the next page.
        failed_page = c.get("/jobs", params={"status": "failed"}).text
        assert job_ids(failed_page) == sorted(old_failed + other, reverse=True)
        assert next_link(failed_page) is None
        queued_page = c.get("/jobs", params={"status": "queued", "queue": "mail"}).text
        link = next_link(queued_page)
        assert link is not None and "status=queued" in link and "queue=mail" in link
        assert job_ids(c.get(link).text) == sorted(queued, reverse=True)[50:]
        bad = c.get("/jobs", params={"id": "x1"})
        assert bad.status_code == 200 and "id: not a job id" in bad.text


def test_job_page_escapes_user_data_and_shows_attempts(dsn, conn):
    [job_id] = add_finished(conn, 1, status="done", kind="noop", error=f"{SCRIPT} {IMG}", dedupe_key=IMG,
                            payload={"html": SCRIPT, "attr": IMG})
    conn.execute("UPDATE pgfence.job_history SET attempt = 3, worker = 'host:9:c', result = %s WHERE id = %s",
                 (json.dumps({"note": SCRIPT}), job_id))
    for attempt in (1, 2):
        conn.execute("INSERT INTO pgfence.job_attempts (job_id, attempt, worker, started_at, outcome, detail) "
                     "VALUES (%s, %s, %s, now(), 'error', %s)", (job_id, attempt, f"host:9:{attempt}", f"E{attempt} {SCRIPT}"))
    with client(dsn) as c:
        pages = [c.get(f"/jobs/{job_id}").text, c.get("/jobs").text, c.get("/jobs", params={"dedupe_key": IMG}).text]
    for page in pages:
        assert SCRIPT not in page and "<img" not in page and "onerror=alert(1)>" not in page
    job_page = pages[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in job_page
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in job_page
    payload = re.search(r'<pre id="payload">(.*?)</pre>', job_page, re.S).group(1)
    assert json.loads(htmllib.unescape(payload)) == {"attr": IMG, "html": SCRIPT}
    result = re.search(r'<pre id="result">(.*?)</pre>', job_page, re.S).group(1)
    assert json.loads(htmllib.unescape(result)) == {"note": SCRIPT}
    assert '<pre id="result">' not in pages[1]
    assert f'<code id="idempotency-key">pgfence:job:{job_id}</code>' in job_page
    rows = re.findall(r'<tr class="attempt" data-attempt="(\d+)">.*?<td class="worker">(.*?)</td>.*?'
                      r'<td class="outcome">(.*?)</td>\s*<td class="detail">(.*?)</td>', job_page, re.S)
    assert [(int(a), w, o, htmllib.unescape(d)) for a, w, o, d in rows] == [
        (1, "host:9:1", "error", f"E1 {SCRIPT}"), (2, "host:9:2", "error", f"E2 {SCRIPT}"), (3, "host:9:c", "done", "")]
    assert pages[2].count("<tr data-job-id=") == 1
    with client(dsn, redact_payloads=True) as c:
        redacted = c.get(f"/jobs/{job_id}").text
    assert '<pre id="payload">redacted</pre>' in redacted and "alert" not in redacted.split('id="payload"')[1][:40]
    assert '<pre id="result">redacted</pre>' in redacted


def test_a_post_without_a_valid_csrf_token_is_refused(dsn, conn):
    add_live(conn, 1, queue="mail")
    with client(dsn) as c:
        page = c.get("/").text
        token = csrf_of(page)
        for data in ({"queue": "mail"}, {"queue": "mail", "csrf_token": ""}, {"queue": "mail", "csrf_token": "0" * 64},
                     {"queue": "mail", "csrf_token": auth.Signer().csrf_token("another-nonce")}):
            response = c.post("/queues/pause", data=data)
            assert response.status_code == 403, data
        # The right token without its cookie (another site's form) is refused too.
        bare = TestClient(c.app, follow_redirects=False)
        assert bare.post("/queues/pause", data={"queue": "mail", "csrf_token": token}).status_code == 403
        [failed] = add_finished(conn, 1)
        for url in (f"/jobs/{failed}/retry", "/jobs/selected", "/jobs/bulk"):
            assert c.post(url, data={"ids": str(failed), "action": "retry", "upto": str(failed)}).status_code == 403
        assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses") == 0
        assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (failed,)) == "failed"
        response = c.post("/queues/pause", data={"queue": "mail", "csrf_token": token})
        assert response.status_code == 303
        assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses WHERE queue = 'mail'") == 1


def test_read_only_renders_no_action_and_refuses_every_post(dsn, conn):
    [failed] = add_finished(conn, 1)
    [queued] = add_live(conn, 1, queue="mail")
    # Tokens valid for both apps (one secret): read-only alone refuses.
    secret = b"s" * 32
    with client(dsn, secret=secret) as writer:
        token = csrf_of(writer.get("/").text)
        cookie = writer.cookies.get(auth.CSRF_COOKIE)
    with client(dsn, read_only=True, secret=secret) as c:
        pages = [c.get("/").text, c.get("/jobs").text, c.get(f"/jobs/{failed}").text, c.get(f"/jobs/{queued}").text]
        for page in pages:
            assert 'method="post"' not in page
            for marker in ('data-action="pause"', 'id="bulk-retry"', 'id="selected-retry"', 'id="retry-job"',
                           'id="cancel-job"', 'id="delete-job"', 'name="ids"'):
                assert marker not in page
        assert 'id="read-only"' in pages[0]
        assert c.get("/jobs/bulk", params={"action": "retry"}).status_code == 403
        c.cookies.set(auth.CSRF_COOKIE, cookie)
        for url, data in (("/queues/pause", {"queue": "mail"}), (f"/jobs/{failed}/retry", {}),
                          (f"/jobs/{queued}/delete", {}), ("/jobs/selected", {"ids": str(queued), "action": "cancel"}),
                          ("/jobs/bulk", {"action": "retry", "upto": str(failed)})):
            assert c.post(url, data=data | {"csrf_token": token}).status_code == 403, url
    assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses") == 0
    assert [scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (i,)) for i in (failed, queued)] == \
        ["failed", "queued"]


def test_bulk_retry_of_every_failed_job_matching_a_filter_in_batches(dsn, conn):
    target = add_finished(conn, 1234, queue="mail", error="SMTP down")
    done = add_finished(conn, 20, status="done", queue="mail", error=None)
    elsewhere = add_finished(conn, 7, queue="billing", error="SMTP down")
    with client(dsn) as c:
        listing = c.get("/jobs", params={"queue": "mail", "status": "failed"}).text
        assert 'id="bulk-retry"' in listing
        confirm = c.get("/jobs/bulk", params={"action": "retry", "queue": "mail", "status": "failed"})
        assert confirm.status_code == 200
        assert re.search(r'<span id="bulk-count">(\d+)</span>', confirm.text).group(1) == "1234"
        assert 'id="confirm-bulk"' in confirm.text
        # A failed job that arrives after the count is left alone.
        [late] = add_finished(conn, 1, queue="mail")
        form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"',
                               confirm.text.split('id="confirm"')[1]))
        assert form["action"] == "retry" and form["upto"] == str(max(target))
        response = c.post("/jobs/bulk", data=form)
        # Recorded, and run in the background: the answer is the action's page.
        assert response.status_code == 303
        assert re.fullmatch(r"/operations/\d+", response.headers["location"])
        wait_for(lambda: scalar(conn, "SELECT state FROM pgfence.bulk_actions") == "done", message="done")
        page = c.get(response.headers["location"]).text
        assert re.search(r'<span id="op-acted">(\d+)</span>', page).group(1) == "1234"
    requeued = [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs WHERE status = 'queued' ORDER BY id")]
    assert requeued == target
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE status = 'failed'") == len(elsewhere) + 1
    assert scalar(conn, "SELECT count(*) FROM pgfence.job_history WHERE id = ANY(%s) AND status = 'done'", (done,)) \
        == 20
    assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (late,)) == "failed"


def test_bulk_actions_in_batches_count_exactly(dsn, conn):
    queued = add_live(conn, 1100, queue="mail")
    running = add_live(conn, 3, status="running", queue="mail")
    with client(dsn) as c:
        form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"',
                               c.get("/jobs/bulk", params={"action": "delete", "queue": "mail"}).text))
        assert c.post("/jobs/bulk", data=form).status_code == 303
        wait_for(lambda: scalar(conn, "SELECT state FROM pgfence.bulk_actions") == "done", message="done")
    # Newest first, 500 a batch (each read, then acted on), the running jobs never taken.
    assert conn.execute("SELECT matched, acted, left_alone, batches FROM pgfence.bulk_actions").fetchone() == \
        (1100, 1100, 0, 3)
    assert [r[0] for r in conn.execute("SELECT id FROM pgfence.jobs ORDER BY id")] == running
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s)", (queued,)) == 0


def test_selected_jobs_cancel_delete_and_retry(dsn, conn):
    queued = add_live(conn, 3, queue="mail")
    [running] = add_live(conn, 1, status="running", queue="mail")
    [done] = add_finished(conn, 1, status="done", queue="mail", error=None)
    with client(dsn) as c:
        token = csrf_of(c.get("/jobs").text)
        response = c.post("/jobs/selected", data={"csrf_token": token, "action": "cancel", "queue": "mail",
                                                   "ids": [str(queued[0]), str(queued[1]), str(done)]})
        assert response.status_code == 303 and response.headers["location"] == "/jobs?queue=mail"
        assert flash(c.get("/jobs").text) == ("cancelled 2 job(s); 1 left alone (not queued or running any more)")
        response = c.post("/jobs/selected", data={"csrf_token": token, "action": "delete",
                                                   "ids": [str(queued[2]), str(running), str(done)]})
        assert flash(c.get("/jobs").text) == "deleted 2 job(s); 1 left alone (running, or gone)"
        assert c.post(f"/jobs/{queued[0]}/retry", data={"csrf_token": token}).headers["location"] == \
            f"/jobs/{queued[0]}"
    statuses = dict(conn.execute("SELECT id, status FROM pgfence.all_jobs").fetchall())
    assert statuses == {queued[0]: "queued", queued[1]: "cancelled", running: "running"}


def test_job_page_shows_the_actions_its_status_allows(dsn, conn):
    [failed] = add_finished(conn, 1)
    [running] = add_live(conn, 1, status="running")
    with client(dsn) as c:
        failed_page, running_page = c.get(f"/jobs/{failed}").text, c.get(f"/jobs/{running}").text
        assert re.findall(r'id="(\w+)-job"', failed_page) == ["retry", "delete"]
        assert re.findall(r'id="(\w+)-job"', running_page) == ["cancel"]
        assert c.get("/jobs/999999").status_code == 404
        token = csrf_of(running_page)
        assert c.post(f"/jobs/{running}/cancel", data={"csrf_token": token}).status_code == 303
    assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (running,)) == "cancelled"


def test_pause_and_resume_a_queue(dsn, conn):
    add_live(conn, 2, queue="mail")
    add_live(conn, 1, queue="reports")
    with psycopg.connect(dsn, autocommit=True) as listener, client(dsn) as c:
        listener.execute("LISTEN pgfence_pauses")
        overview = c.get("/").text
        rows = dict(re.findall(r'<tr data-queue="([^"]+)">.*?<td class="paused">(\w+)</td>', overview, re.S))
        assert rows == {"mail": "running", "reports": "running"}
        assert 'data-action="pause" data-queue="mail"' in overview
        token = csrf_of(overview)
        assert c.post("/queues/pause", data={"csrf_token": token, "queue": "mail"}).status_code == 303
        notes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert notes == ["mail"]
        overview = c.get("/").text
        assert flash(overview) == "paused queue mail"
        rows = dict(re.findall(r'<tr data-queue="([^"]+)">.*?<td class="paused">(\w+)</td>', overview, re.S))
        assert rows == {"mail": "paused", "reports": "running"}
        assert 'data-action="resume" data-queue="mail"' in overview
        assert conn.execute("SELECT queue, paused_by FROM pgfence.queue_pauses").fetchall() == [("mail", "pgfence web")]
        assert c.post("/queues/resume", data={"csrf_token": token, "queue": "mail"}).status_code == 303
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["mail"]
        assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses") == 0
        assert c.post("/queues/pause", data={"csrf_token": token, "queue": "bad queue"}).status_code == 400


def test_a_password_guards_every_page(dsn, conn):
    import base64

    with client(dsn, password="s3cret") as c:
        response = c.get("/jobs?status=failed")
        assert response.status_code == 303
        assert response.headers["location"] == "/login?next=%2Fjobs%3Fstatus%3Dfailed"
        assert c.post("/queues/pause", data={"queue": "mail"}).status_code == 401
        assert c.get("/static/pgfence.css").status_code == 200
        login = c.get("/login?next=/jobs").text
        token = csrf_of(login)
        wrong = c.post("/login", data={"csrf_token": token, "password": "nope", "next": "/jobs"})
        assert wrong.status_code == 403 and "wrong password" in wrong.text
        assert c.post("/login", data={"password": "s3cret", "next": "/jobs"}).status_code == 403   # no token
        right = c.post("/login", data={"csrf_token": token, "password": "s3cret", "next": "//evil.example/"})
        assert right.status_code == 303 and right.headers["location"] == "/"
        assert c.get("/jobs").status_code == 200
    basic = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    with client(dsn, password="s3cret") as c:
        assert c.get("/", headers={"Authorization": basic}).status_code == 200
        assert c.get("/", headers={"Authorization": "Basic " + base64.b64encode(b"ops:x").decode()}).status_code == 303


def test_security_headers_and_mounting_under_a_path(dsn, conn):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    [job_id] = add_finished(conn, 1)
    inner = create_app(dsn)
    _apps.append(inner)
    outer = Starlette(routes=[Mount("/ops/pgfence", app=inner)])
    with TestClient(outer, follow_redirects=False) as c:
        page = c.get("/ops/pgfence/jobs")
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert f'href="/ops/pgfence/jobs/{job_id}"' in page.text
        assert 'href="/ops/pgfence/static/pgfence.css"' in page.text
        assert c.get("/ops/pgfence/static/pgfence.css").status_code == 200
        token = csrf_of(page.text)
        response = c.post(f"/ops/pgfence/jobs/{job_id}/retry", data={"csrf_token": token})
        assert response.status_code == 303 and response.headers["location"] == f"/ops/pgfence/jobs/{job_id}"
    assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "queued"


def test_the_job_list_reads_the_id_indexes(dsn, conn):
    """The first page is a Merge Append of backward scans of the id indexes
    of pgfence.jobs and of history's partitions, cut by the Limit."""
    add_finished(conn, 20000, status="done", error=None)
    add_live(conn, 2000)
    conn.execute("ANALYZE pgfence.jobs")
    conn.execute("ANALYZE pgfence.job_history")
    from pgfence.store.queries import q

    params = {"before": None, "upto": None, "id": None, "queue": None, "kind": None, "status": None,
              "dedupe_key": None, "error": None, "statuses": None, "limit": 51}
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + q("web_jobs_page"), params).fetchall())
    assert plan.lstrip().startswith("Limit")
    assert "Merge Append" in plan and "Seq Scan" not in plan and not re.search(r"->\s+Sort\b", plan), plan
    assert "Index Scan Backward using jobs_pkey" in plan
    assert "job_history_default_id_idx" in plan or re.search(r"Index (Only )?Scan Backward using job_history_\w+", plan)


# -- pgfence web, the command --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_non_loopback_host_without_a_password_is_one_line_and_exit_2(dsn):
    secret_dsn = dsn + " password=hunter2"
    env = env_for(secret_dsn)
    out = run_pgfence("web", "--host", "0.0.0.0", "--port", str(_free_port()), env=env)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "PGFENCE_WEB_PASSWORD" in out.stderr and "0.0.0.0" in out.stderr
    assert "hunter2" not in out.stderr
    out = run_pgfence("web", "--port", "70000", env=env)
    assert (out.returncode, out.stderr) == (2, "pgfence: error: invalid port: must be 1 to 65535, got 70000\n")


def test_pgfence_web_serves_the_dashboard_until_sigterm(dsn, conn):
    [job_id] = add_finished(conn, 1)
    port = _free_port()
    proc = spawn("web", "--port", str(port), "--read-only", env=env_for(dsn, PGFENCE_WEB_PASSWORD="pw"))
    try:
        def answer():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/jobs/{job_id}", auth=("", "pw"), timeout=2)
            except httpx.HTTPError:
                return None

        response = wait_for(answer, message="pgfence web answering")
        assert response.status_code == 200 and f"Job {job_id}" in response.text
        assert 'method="post"' not in response.text.split("</nav>")[1]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 303
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert f"pgfence web on http://127.0.0.1:{port}/ (database " in err and "read-only, password required)" in err


def test_a_job_that_failed_twice_then_succeeded_shows_three_attempts(dsn, conn, make_worker):
    from pgfence import enqueue, handler

    @handler("t_flaky_web")
    def flaky(job):
        if job.attempt < 3:
            raise RuntimeError(f"attempt {job.attempt} <failed>")

    job_id = enqueue(conn, "t_flaky_web", queue="flaky")
    worker = make_worker("w-flaky", backoff_base=0.05, backoff_max=0.1, queues=("flaky",))

    def finished():
        for job in worker.claim():
            worker.run_job(job)
        return scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done"

    wait_for(finished, timeout=20, message="the flaky job to succeed at its third attempt")
    with client(dsn) as c:
        page = c.get(f"/jobs/{job_id}").text
    rows = re.findall(r'<tr class="attempt" data-attempt="(\d+)">.*?<td class="worker">(.*?)</td>.*?'
                      r'<td class="outcome">(.*?)</td>\s*<td class="detail">(.*?)</td>', page, re.S)
    assert [(int(a), w, o, htmllib.unescape(d)) for a, w, o, d in rows] == [
        (1, "w-flaky", "error", "RuntimeError: attempt 1 <failed>"),
        (2, "w-flaky", "error", "RuntimeError: attempt 2 <failed>"),
        (3, "w-flaky", "done", "")]
    assert "<failed>" not in page


def test_overview_lists_supervisors_up_and_schedules_get_a_page(dsn, conn):
    [running] = add_live(conn, 1, status="running", queue="mail")
    children = [{"number": 1, "pid": 4242, "jobs": [{"id": running, "kind": "noop", "queue": "mail", "attempt": 1}]},
                {"number": 2, "pid": 4243, "jobs": []}]
    conn.execute("""INSERT INTO pgfence.supervisors (instance, host, pid, workers, version, started_at, last_seen, children)
                    VALUES ('up-1', 'host-a', 100, 2, '0.2.0', now(), now(), %s::jsonb),
                           ('gone-1', 'host-b', 200, 2, '0.2.0', now() - interval '1 hour',
                            now() - interval '31 seconds', '[]')""", (json.dumps(children),))
    with client(dsn) as c:
        overview = c.get("/").text
        assert re.findall(r'<tr data-instance="([^"]+)">', overview) == ["up-1"]
        assert f'<a class="running-job" data-job-id="{running}" href="/jobs/{running}">noop #{running}</a>' in overview
        assert 'id="nav-schedules"' not in overview
        conn.execute(f"""INSERT INTO pgfence.schedules (name, kind, every_seconds, payload)
                         VALUES ('nightly', 'noop', 60, %s::jsonb)""", (json.dumps({"x": SCRIPT}),))
        overview = c.get("/").text
        assert '<a id="nav-schedules" href="/schedules">' in overview
        schedules = c.get("/schedules").text
        assert re.findall(r'<tr data-schedule="([^"]+)">', schedules) == ["nightly"]
        assert "every 60s" in schedules and SCRIPT not in schedules
