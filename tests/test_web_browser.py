"""The dashboard driven in a real headless Chromium.

Each test starts a real ``pgfence web`` on a free port against its own
database, real ``pgfence run`` supervisors where jobs must run, and reads and
acts through the pages as an operator does, by the ids, classes and data
attributes the templates keep stable for it (supervisor/web/templates):
filter rows, follow the next page, open a job, press the forms' buttons.  The database is read only to check
what the browser did (statuses, counts) and to set up history in bulk.

Chromium and its driver are Debian's (``apt-get install chromium
chromium-driver``, done by .ci/run); the module is skipped without them.
With ``PGFENCE_SCREENSHOTS=1`` the attempt-history test saves the README's
screenshots to docs/screenshots/ (CI leaves them alone).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="the browser tests need Debian's chromium and chromium-driver (/usr/bin/chromium, "
           "/usr/bin/chromedriver): apt-get install chromium chromium-driver")

webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need selenium (the dev extra)")

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException, StaleElementReferenceException, WebDriverException)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from metricstools import free_port, http_get, total  # noqa: E402
from pgtools import ROOT, env_for, scalar, spawn, wait_for  # noqa: E402
from pgfence import enqueue  # noqa: E402

#: The handler modules of the tests' supervisors (tests/web_handlers.py:
#: flaky, hold).
HANDLERS = "pgfence.handlers.builtin,web_handlers"
SCREENSHOTS = ROOT / "docs" / "screenshots"

XSS_SCRIPT = "<script>window.__pwned=1</script>"
XSS_IMG = '"><img src=x onerror="window.__pwned=2">'


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module (each test clears its cookies)."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,900", "--lang=en-US"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def start_web(dsn: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a real `pgfence web ARGS` on a free port against the test's
    database; its base URL.  Its log goes to a file (an access line per
    request would fill a pipe), shown when it fails to start.  Stopped
    (SIGTERM) afterwards."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        port = free_port()
        log = tmp_path / f"web-{port}.log"
        with log.open("w") as out:
            proc = spawn("web", "--port", str(port), *args, env=env_for(dsn), stdout=out,
                         stderr=subprocess.STDOUT)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: proc.poll() is not None or http_get(base + "/")[0] == 200, timeout=30,
                 message="pgfence web to answer GET / with 200")
        if proc.poll() is not None:
            pytest.fail(f"pgfence web exited with {proc.returncode}: {log.read_text()[-2000:]}")
        return base

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def browse(chromium: Any, start_web: Callable[..., str]) -> Callable[..., Page]:
    """The browser on a new `pgfence web ARGS`."""

    def browse(*args: str) -> Page:
        base = start_web(*args)
        # Cookies ignore the port: another server's session and CSRF
        # cookies must not reach this one.
        chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
        return Page(chromium, base)

    return browse


@pytest.fixture
def page(browse: Callable[..., Page]) -> Page:
    """The browser on a `pgfence web` with its defaults."""
    return browse()


def left(old: WebElement) -> Callable[[Any], bool]:
    """EC.staleness_of(old), but also true when Chromium answers the look at
    the old page's node with "unhandled inspector error: Node with given id
    does not belong to the document" instead of a stale element (seen in a
    suite run two at a time): that, too, says the old page is gone."""
    def gone(_driver: Any) -> bool:
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False
    return gone


class Page:
    """The browser on one dashboard, with the UI contract's selectors."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base

    # navigation

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def submit(self, button: WebElement) -> None:
        """Press a form's button and wait for the page it leads to."""
        old = self.driver.find_element(By.TAG_NAME, "html")
        button.click()
        WebDriverWait(self.driver, 15).until(left(old))

    def press(self, css: str) -> None:
        """Press the button ``css`` and wait for the page it leads to.  A
        click Chromium refuses before dispatching it, because the node it
        found no longer belongs to the document (seen once in CI, the page
        loaded and untouched), is tried again on the button found anew: that
        click never reached the form, so nothing is sent twice."""
        for tries_left in (2, 1, 0):
            old = self.driver.find_element(By.TAG_NAME, "html")
            try:
                self.one(css).click()
            except (StaleElementReferenceException, WebDriverException) as exc:
                refused = isinstance(exc, StaleElementReferenceException) or "does not belong to the document" in str(
                    exc)
                if not refused or not tries_left:
                    raise
                continue
            WebDriverWait(self.driver, 15).until(left(old))
            return

    def until(self, condition: Callable[[], Any], path: str | None = None, timeout: float = 30,
              message: str = "condition") -> Any:
        """Poll ``condition`` on the page, reloading ``path`` (default: the
        current URL) before each look, until it is truthy."""
        target = path or self.driver.current_url.removeprefix(self.base)

        def look() -> Any:
            self.open(target)
            try:
                return condition()
            except (NoSuchElementException, StaleElementReferenceException):
                return None

        return wait_for(look, timeout=timeout, interval=0.2, message=message)

    # reading

    def one(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def has(self, css: str) -> bool:
        return bool(self.all(css))

    def text(self, css: str) -> str:
        return self.one(css).text.strip()

    def body(self) -> str:
        return self.one("body").text

    def job_ids(self) -> list[int]:
        """The ids of the rows of table#jobs, in page order."""
        return [int(tr.get_attribute("data-job-id")) for tr in self.all("table#jobs tr[data-job-id]")]

    def attempts(self) -> list[tuple[int, str, str]]:
        """(attempt, outcome, detail) of each row of table#attempts, in page order."""
        return [(int(tr.get_attribute("data-attempt")), tr.find_element(By.CSS_SELECTOR, "td.outcome").text.strip(),
                 tr.find_element(By.CSS_SELECTOR, "td.detail").text.strip())
                for tr in self.all("table#attempts tr.attempt")]

    def fields(self) -> dict[str, str]:
        """dl#job as {term, lowercased: its description}."""
        terms = self.all("dl#job dt")
        return {dt.text.strip().lower(): dt.find_element(By.XPATH, "following-sibling::dd[1]").text.strip()
                for dt in terms}

    def queue_row(self, queue: str) -> WebElement:
        return self.one(f'tr[data-queue="{queue}"]')

    def paused_state(self, queue: str) -> str:
        return self.queue_row(queue).find_element(By.CSS_SELECTOR, "td.paused").text.strip()

    def pwned(self) -> Any:
        return self.driver.execute_script("return window.__pwned")

    # acting

    def filter(self, **values: str) -> None:
        """Fill form#filter on /jobs (a field left out is emptied) and apply it."""
        self.open("/jobs")
        form = self.one("form#filter")
        for name in ("queue", "kind", "status", "id", "dedupe_key", "error"):
            field = form.find_element(By.NAME, name)
            value = values.pop(name, "")
            if field.tag_name == "select":
                Select(field).select_by_value(value)
            else:
                field.clear()
                if value:
                    field.send_keys(value)
        assert not values, f"form#filter has no field {sorted(values)}"
        self.press("button#apply-filter")

    def open_job(self, job_id: int) -> None:
        """Follow the link of a row of table#jobs to the job's page."""
        link = self.one(f'table#jobs tr[data-job-id="{job_id}"] a[href*="/jobs/{job_id}"]')
        self.submit(link)
        assert self.driver.current_url.endswith(f"/jobs/{job_id}")

    def screenshot(self, name: str) -> None:
        """Save the whole page as docs/screenshots/NAME.png, when asked to."""
        if os.environ.get("PGFENCE_SCREENSHOTS") != "1":
            return
        # The viewport made as tall as the page, so the capture holds all of it.
        height = int(self.driver.execute_script("return document.documentElement.scrollHeight"))
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1280, "height": max(600, min(height, 3000)), "deviceScaleFactor": 1, "mobile": False})
        try:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            assert self.driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
        finally:
            self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def statuses(conn: Any, ids: list[int]) -> list[str]:
    rows = dict(conn.execute("SELECT id, status FROM pgfence.all_jobs WHERE id = ANY(%s)", (ids,)).fetchall())
    return [rows.get(i, "missing") for i in ids]


def count(conn: Any, queue: str, status: str) -> int:
    return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE queue = %s AND status = %s", (queue, status))


# -- tests ----------------------------------------------------------------------------


def test_failed_jobs_of_one_queue_and_attempt_history(dsn, conn, runs, page):
    """Filter the failed jobs of one queue, open one and read its attempts;
    a job that errored twice and then succeeded shows three attempts."""
    runs(dsn, "--queues", "mail,billing", "--backoff-base", "50ms", "--handlers", HANDLERS)
    flaky = enqueue(conn, "flaky", {"failures": 2}, queue="mail", max_attempts=5)
    mail_failed = [enqueue(conn, "fail", {"message": f"smtp refused #{n}"}, queue="mail", max_attempts=2)
                   for n in (1, 2)]
    billing_failed = enqueue(conn, "fail", {"message": "card declined"}, queue="billing", max_attempts=1)
    mail_done = [enqueue(conn, "noop", queue="mail") for _ in range(3)]
    every = [flaky, *mail_failed, billing_failed, *mail_done]
    wait_for(lambda: statuses(conn, every) == ["done", "failed", "failed", "failed", "done", "done", "done"],
             timeout=30, message="every job finished")

    page.filter(queue="mail", status="failed")
    assert page.job_ids() == sorted(mail_failed, reverse=True)
    page.open_job(mail_failed[0])
    assert page.attempts() == [(1, "error", "RuntimeError: smtp refused #1"),
                               (2, "error", "RuntimeError: smtp refused #1")]
    assert page.fields()["status"] == "failed"
    assert [page.has(b) for b in ("button#retry-job", "button#cancel-job", "button#delete-job")] == [True, False, True]

    page.filter(queue="billing", status="failed")
    assert page.job_ids() == [billing_failed]

    page.filter(queue="mail", kind="flaky")
    assert page.job_ids() == [flaky]
    page.open_job(flaky)
    attempts = page.attempts()
    assert [(attempt, outcome) for attempt, outcome, _detail in attempts] == [(1, "error"), (2, "error"),
                                                                              (3, "done")]
    assert [detail for _attempt, _outcome, detail in attempts[:2]] == [
        "RuntimeError: flaky: attempt 1 fails on purpose", "RuntimeError: flaky: attempt 2 fails on purpose"]
    fields = page.fields()
    assert (fields["status"], fields["queue"], fields["kind"]) == ("done", "mail", "flaky")
    assert json.loads(page.text("pre#payload")) == {"failures": 2}
    assert page.text("#idempotency-key") == f"pgfence:job:{flaky}"
    # A done job can only be deleted (retry takes failed and cancelled jobs).
    assert [page.has(b) for b in ("button#retry-job", "button#cancel-job", "button#delete-job")] == [False, False, True]
    page.screenshot("job")

    page.open("/")
    assert page.paused_state("mail") == "running"
    assert page.paused_state("billing") == "running"


def test_bulk_retry_of_a_filter_across_pages(dsn, conn, runs, page):
    """1,000 failed jobs of one queue, 20 pages of 50: retry everything the
    filter matches, confirmed with its count, and see a worker run them."""
    # History as workers leave it, written in bulk: 3 done and 5 failed
    # jobs the filter must leave out, then the 1,000 failed jobs of queue
    # bulk (the newest ids).
    conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, attempt, max_attempts, started_at)
        SELECT 'done', 'bulk', 'noop', 1, 1, now() FROM generate_series(1, 3)""")
    conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, attempt, max_attempts, started_at, last_error)
        SELECT 'failed', 'other', 'noop', 1, 1, now(), 'upstream 503' FROM generate_series(1, 5)""")
    conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, attempt, max_attempts, started_at, last_error, payload)
        SELECT 'failed', 'bulk', 'noop', 1, 1, now(), 'upstream 503', jsonb_build_object('n', g)
          FROM generate_series(1, 1000) g""")
    failed = [r[0] for r in conn.execute(
        "SELECT id FROM pgfence.job_history WHERE queue = 'bulk' AND status = 'failed' ORDER BY id DESC")]

    page.filter(queue="bulk", status="failed")
    seen: list[int] = []
    pages = 0
    while True:
        ids = page.job_ids()
        pages += 1
        assert ids == failed[len(seen):len(seen) + 50], f"page {pages}"
        seen += ids
        if not page.has("a#next-page"):
            break
        page.submit(page.one("a#next-page"))
    assert (pages, seen) == (20, failed)

    page.filter(queue="bulk", status="failed")
    page.press("button#bulk-retry")
    assert page.text("#bulk-count") == "1000"
    # Nothing moves before the confirmation.
    assert count(conn, "bulk", "failed") == 1000
    page.press("button#confirm-bulk")
    # The action runs in the background: its page shows how far it got.
    assert page.text("#flash").startswith("operation ") and "/operations/" in page.driver.current_url
    page.until(lambda: page.text("#op-state") == "done", message="the bulk retry done")
    assert (page.text("#op-acted"), page.text("#op-matched"), page.text("#op-left-alone")) == ("1000", "1000", "0")
    assert (count(conn, "bulk", "queued"), count(conn, "bulk", "failed"), count(conn, "other", "failed")) == (1000, 0, 5)
    # The filter now matches nothing.
    page.filter(queue="bulk", status="failed")
    assert page.job_ids() == []

    runs(dsn, "--queues", "bulk", "--handlers", HANDLERS)
    wait_for(lambda: count(conn, "bulk", "done") == 1003, timeout=60, message="the 1,000 retried jobs done")
    assert (count(conn, "bulk", "queued"), count(conn, "bulk", "failed"), count(conn, "other", "failed")) == (0, 0, 5)
    # Each ran its second attempt, with its own id.
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s) AND status = 'done' AND attempt = 2",
                  (failed,)) == 1000
    page.filter(queue="bulk", status="done")
    assert page.job_ids() == failed[:50]


def test_cancel_a_running_job_and_its_completion_is_refused(dsn, conn, runs, page):
    """Cancel a running job from its page: the job is cancelled and its
    worker's completion meets the fence."""
    # A 3 s lease is renewed every second: the worker learns of the cancel
    # within about a second.
    run = runs(dsn, "--queues", "slow", "--workers", "1", "--lease", "3", "--handlers", HANDLERS)
    job_id = enqueue(conn, "hold", {"seconds": 60}, queue="slow", max_attempts=3)
    wait_for(lambda: statuses(conn, [job_id]) == ["running"], message="the job running")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                  "state = 'idle in transaction' "
                                  "AND application_name LIKE 'pgfence worker %%'") == 1,
             message="the handler inside its fenced transaction")

    page.open(f"/jobs/{job_id}")
    assert page.fields()["status"] == "running"
    assert [(attempt, outcome) for attempt, outcome, _detail in page.attempts()] == [(1, "running")]
    assert [page.has(b) for b in ("button#retry-job", "button#cancel-job")] == [False, True]
    page.press("button#cancel-job")
    assert page.text("#flash") == "cancelled 1 job(s)"
    assert statuses(conn, [job_id]) == ["cancelled"]

    # The worker's completion is refused: counted as a prevented double run,
    # and the effect it wrote in its fenced transaction is rolled back.
    wait_for(lambda: total(run.try_scrape(), "pgfence_double_run_prevented_total", kind="hold") == 1,
             timeout=20, message="pgfence_double_run_prevented_total{kind=hold} 1")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                  "state = 'idle in transaction' "
                                  "AND application_name LIKE 'pgfence worker %%'") == 0,
             message="the fenced transaction ended")
    assert scalar(conn, "SELECT count(*) FROM pgfence_examples.effects WHERE job_id = %s", (job_id,)) == 0
    assert statuses(conn, [job_id]) == ["cancelled"]

    # Its attempt ended twice: cancelled by the operator, then its
    # completion refused by the fence (recorded right after the worker's
    # transaction rolled back).
    page.until(lambda: len(page.attempts()) == 2, path=f"/jobs/{job_id}", message="two attempt rows")
    assert [(attempt, outcome) for attempt, outcome, _detail in page.attempts()] == [(1, "cancelled"),
                                                                                     (1, "fence_rejected")]
    assert page.fields()["status"] == "cancelled"
    assert [page.has(b) for b in ("button#retry-job", "button#cancel-job")] == [True, False]


def test_pause_and_resume_a_queue_from_the_overview(dsn, conn, runs, page):
    """Pause a queue on the overview: a running `pgfence run` stops claiming
    from it while it goes on with another queue; resume, and they run."""
    runs(dsn, "--queues", "reports,emails", "--handlers", HANDLERS)
    first = [enqueue(conn, "noop", queue="reports"), enqueue(conn, "noop", queue="emails")]
    wait_for(lambda: statuses(conn, first) == ["done", "done"], message="a job of each queue run before the pause")

    page.open("/")
    assert page.paused_state("reports") == "running"
    assert not page.has('button[data-action="resume"][data-queue="reports"]')
    page.press('button[data-action="pause"][data-queue="reports"]')
    assert page.text("#flash") == "paused queue reports"
    page.until(lambda: page.paused_state("reports") == "paused", path="/", message="reports shown paused")
    assert page.paused_state("emails") == "running"
    assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses WHERE queue = 'reports'") == 1

    # Enqueued after the pause: the reports jobs first, so that a worker
    # that still claimed them would take them before the emails.
    reports = [enqueue(conn, "noop", queue="reports") for _ in range(3)]
    emails = [enqueue(conn, "noop", queue="emails") for _ in range(3)]
    wait_for(lambda: statuses(conn, emails) == ["done"] * 3, message="the emails jobs run during the pause")
    assert statuses(conn, reports) == ["queued"] * 3
    assert scalar(conn, "SELECT max(attempt) FROM pgfence.jobs WHERE id = ANY(%s)", (reports,)) == 0

    # The supervisor that runs them is listed as up.
    page.until(lambda: len(page.all("#supervisors tr[data-instance]")) == 1, path="/",
               message="one supervisor listed up")
    assert page.paused_state("reports") == "paused"
    page.screenshot("overview")

    page.open("/")
    page.press('button[data-action="resume"][data-queue="reports"]')
    assert page.text("#flash") == "resumed queue reports"
    page.until(lambda: page.paused_state("reports") == "running", path="/", message="reports shown running")
    wait_for(lambda: statuses(conn, reports) == ["done"] * 3, message="the reports jobs run after the resume")
    assert scalar(conn, "SELECT count(*) FROM pgfence.queue_pauses") == 0


def test_payload_and_error_render_as_text(dsn, conn, runs, page):
    """A payload, an error and a dedupe key holding markup are shown as
    their literal text, and none of it runs."""
    message = f"{XSS_SCRIPT} {XSS_IMG}"
    payload = {"message": message, "note": XSS_IMG, "html": XSS_SCRIPT}
    runs(dsn, "--queues", "web", "--handlers", HANDLERS)
    job_id = enqueue(conn, "fail", payload, queue="web", max_attempts=1, dedupe_key=XSS_IMG)
    wait_for(lambda: statuses(conn, [job_id]) == ["failed"], message="the job failed")
    error = f"RuntimeError: {message}"
    assert scalar(conn, "SELECT last_error FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == error

    page.open(f"/jobs/{job_id}")
    assert json.loads(page.text("pre#payload")) == payload
    assert page.attempts() == [(1, "error", error)]
    fields = page.fields()
    assert XSS_IMG in fields.values()
    assert error in page.body()
    assert page.all('img[src="x"]') == []
    assert all("__pwned" not in (s.get_attribute("innerHTML") or "") for s in page.all("script"))
    assert page.pwned() is None

    for path in ("/jobs?queue=web", "/jobs?status=failed", f"/jobs?error={quote(XSS_IMG)}", "/"):
        page.open(path)
        assert page.pwned() is None, path
    page.filter(dedupe_key=XSS_IMG)
    assert page.job_ids() == [job_id]
    assert page.pwned() is None


def failed_history(conn: Any, queue: str, n: int) -> list[int]:
    """``n`` failed jobs of ``queue`` written to history as a worker leaves
    them; their ids, newest first."""
    return [r[0] for r in conn.execute("""
        INSERT INTO pgfence.job_history (status, queue, kind, attempt, max_attempts, started_at, last_error)
        SELECT 'failed', %s, 'noop', 1, 1, now(), 'upstream 503' FROM generate_series(1, %s)
        RETURNING id""", (queue, n)).fetchall()][::-1]


def test_retry_a_selection(dsn, conn, page):
    """Tick two rows of the list and retry them: those two alone are queued again."""
    ids = failed_history(conn, "picks", 4)
    page.filter(queue="picks")
    assert page.job_ids() == ids
    for job_id in (ids[0], ids[2]):
        page.one(f'input[name="ids"][value="{job_id}"]').click()
    page.press("button#selected-retry")
    assert page.text("#flash") == "retried 2 job(s)"
    assert statuses(conn, ids) == ["queued", "failed", "queued", "failed"]


def test_read_only_shows_no_action(dsn, conn, browse):
    """`pgfence web --read-only`: every page renders, with no button and no
    form that acts."""
    ids = failed_history(conn, "archive", 2)
    page = browse("--read-only")
    page.open("/")
    assert page.paused_state("archive") == "running"
    assert page.all("button[data-action]") == []
    page.open("/jobs?queue=archive")
    assert page.job_ids() == ids
    assert page.all('input[name="ids"]') == [] and page.all("form[method=post]") == []
    assert [page.has(f"button#{b}") for b in ("bulk-retry", "bulk-cancel", "bulk-delete", "selected-retry")] == \
        [False] * 4
    page.open(f"/jobs/{ids[0]}")
    assert page.fields()["status"] == "failed"
    assert [page.has(b) for b in ("button#retry-job", "button#cancel-job", "button#delete-job")] == [False] * 3
    assert page.all("form[method=post]") == []
