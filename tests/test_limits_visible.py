"""Concurrency and rate limits made visible: the metrics server's gauges (in process
and scraped from a real `pgfence run`, then through a real Prometheus with
the dashboard's own panel queries), the docs' generated metrics reference,
the dashboard's Limits page, its forms and a job's page, and `pgfence
status`.  Everything on a real database; the limits themselves are
tests/test_limits.py's."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import re
import socket
import sys

import pytest
from metricstools import samples, total
from pgtools import ROOT, scalar, wait_for
from pgtools import pgfence as run_pgfence
from prometheus_client import REGISTRY, generate_latest

import pgfence
from pgfence.admin import limits as admin
from pgfence.observe import metrics
from pgfence.observe.server import MetricsServer
from pgfence.prefork.slots import SlotTable
from pgfence.settings import Settings
from pgfence.store import jobs as jobs_store
from pgfence.store import limits as limits_store

# The real Prometheus and the dashboard's panel queries, as the dashboard's
# own scrape test runs them.
from test_prometheus_scrape import panel_queries, prometheus, query  # noqa: F401

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
#: Kinds of this module alone: the in-process gauges outlive a test.
EXPORT, SYNC, RATED = "t_vis_export", "t_vis_sync", "t_vis_rated"
KINDS = (EXPORT, SYNC, RATED)
LIMIT_GAUGES = ("pgfence_limit_slots_in_use", "pgfence_limit_concurrency", "pgfence_limit_per_key_concurrency",
                "pgfence_limit_rate_per_second", "pgfence_jobs_held_back")
#: The invalid rate's message, as pgfence.limits.parse_rate words it.
BAD_RATE = "invalid rate: must be starts per period such as '100/s', '10/min' or '5/2h', got {!r}"


def claim_one(conn, kind: str) -> int:
    [job] = jobs_store.claim(conn, queues=["default"], batch=1, worker="w-vis", lease=300.0, lease_kinds=[],
                             lease_secs=[], reclaim=False, kinds=[kind])
    return job.id


def seed(conn) -> dict[str, list[int]]:
    """EXPORT: concurrency 2 (set at run time), 5 jobs now, one running and
    one admitted, three waiting, and one held until its run_at in an hour.
    SYNC: per-key concurrency 1 (declared by its handler), keys a, a, b and
    IMG: three holders, one waiting.  RATED: a rate of 10/min (declared by
    its handler: a burst of one start), three jobs, one admitted and two
    waiting (an admitted job not yet claimed takes from the burst, so they
    stay so, whatever the clock says).  Ids by kind, in enqueue order."""
    admin.set_limits(conn, EXPORT, concurrency=2, by="test")
    # As a worker records its handlers' declarations when it starts: a kind
    # that declares nothing gets no row.
    with conn.transaction():
        written = limits_store.declare(conn, [SYNC, RATED, "t_vis_free"], [None, None, None], [1, None, None],
                                       [None, (10, 60.0), None], by="worker")
        assert written == [RATED, SYNC]
        for kind in written:
            limits_store.gate(conn, kind)
    export = [pgfence.enqueue(conn, EXPORT, {"n": n}) for n in range(5)]
    export.append(pgfence.enqueue(conn, EXPORT, {"n": 5}, run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)))
    assert claim_one(conn, EXPORT) == export[0]
    sync = [pgfence.enqueue(conn, SYNC, concurrency_key=key) for key in ("a", "a", "b", IMG)]
    rated = [pgfence.enqueue(conn, RATED, {"n": n}) for n in range(3)]
    held = dict(conn.execute("SELECT id, held_back FROM pgfence.jobs ORDER BY id").fetchall())
    assert held == {export[0]: None, export[1]: None, export[2]: "concurrency", export[3]: "concurrency",
                    export[4]: "concurrency", export[5]: "scheduled",
                    sync[0]: None, sync[1]: "concurrency", sync[2]: None, sync[3]: None,
                    rated[0]: None, rated[1]: "concurrency", rated[2]: "concurrency"}
    assert scalar(conn, "SELECT count(*) FROM pgfence.limits WHERE kind = 't_vis_free'") == 0
    return {EXPORT: export, SYNC: sync, RATED: rated}


def limit_samples(parsed: dict) -> dict[tuple[str, tuple], float]:
    """The limits' samples of a scrape, for this module's kinds."""
    return {(name, labels): value for (name, labels), value in parsed.items()
            if name in LIMIT_GAUGES and dict(labels).get("kind") in KINDS}


Use = tuple[int, int, int, float, int, int]


def expected(export: Use, sync: Use, rated: Use) -> dict[tuple[str, tuple], float]:
    """The samples of each kind, given as (slots in use, concurrency, per-key
    concurrency, rate in starts a second, held back for a slot or the rate,
    held back until their run_at)."""
    out = {}
    for kind, (in_use, conc, per_key, rate, waiting, scheduled) in ((EXPORT, export), (SYNC, sync),
                                                                    (RATED, rated)):
        out[("pgfence_limit_slots_in_use", (("kind", kind),))] = in_use
        out[("pgfence_limit_concurrency", (("kind", kind),))] = conc
        out[("pgfence_limit_per_key_concurrency", (("kind", kind),))] = per_key
        out[("pgfence_limit_rate_per_second", (("kind", kind),))] = rate
        out[("pgfence_jobs_held_back", (("kind", kind), ("reason", "concurrency")))] = waiting
        out[("pgfence_jobs_held_back", (("kind", kind), ("reason", "scheduled")))] = scheduled
    return out


# -- metrics ----------------------------------------------------------------------------


def test_the_metrics_server_sets_the_limit_gauges_from_the_database(conn, dsn, tmp_path, monkeypatch):
    ids = seed(conn)
    # The server's collector wants a multiprocess directory; this process's
    # own gauges stay in memory, where the default registry exposes them.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with socket.socket() as sock:
        server = MetricsServer(sock, dsn, SlotTable(1, 1), 1.0, settings=Settings())
        assert server.refresh_limits() == 3
        # RATED's 10/min: 10 starts over 60 seconds, exactly as the row holds them.
        assert limit_samples(samples(generate_latest(REGISTRY).decode())) == \
            expected(export=(2, 2, 0, 0, 3, 1), sync=(3, 0, 1, 0, 1, 0), rated=(1, 0, 0, 10 / 60, 2, 0))

        # The running job ends: its slot goes to the next waiting job.  A
        # rate set on EXPORT (90/min: 1.5 a second) takes no slot from it.
        with conn.transaction():
            assert jobs_store.complete(conn, ids[EXPORT][0], 1)
        admin.set_limits(conn, SYNC, per_key_concurrency=2, by="test")
        admin.set_limits(conn, EXPORT, rate="90/min", by="test")
        server.refresh_limits()
        assert limit_samples(samples(generate_latest(REGISTRY).decode())) == \
            expected(export=(2, 2, 0, 1.5, 2, 1), sync=(4, 0, 2, 0, 0, 0), rated=(1, 0, 0, 10 / 60, 2, 0))

        # Reset, EXPORT has no limit left (its handler declares none): its
        # jobs go free and every gauge of it reads 0, the limit and the rate too.
        admin.reset(conn, EXPORT, by="test")
        server.refresh_limits()
        assert limit_samples(samples(generate_latest(REGISTRY).decode())) == \
            expected(export=(0, 0, 0, 0, 0, 0), sync=(4, 0, 2, 0, 0, 0), rated=(1, 0, 0, 10 / 60, 2, 0))
    assert scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE kind = %s AND gated", (EXPORT,)) == 0


def test_the_limit_gauges_are_documented_and_labelled_by_kind_alone():
    sys.path.insert(0, str(ROOT / "docs" / "_gen"))
    try:
        import reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "_gen"))
    table = reference.metrics_table()
    for gauge, labels in ((metrics.LIMIT_SLOTS_IN_USE, ("kind",)), (metrics.LIMIT_CONCURRENCY, ("kind",)),
                          (metrics.LIMIT_PER_KEY_CONCURRENCY, ("kind",)), (metrics.LIMIT_RATE, ("kind",)),
                          (metrics.JOBS_HELD_BACK, ("kind", "reason"))):
        assert gauge._labelnames == labels
        assert len(gauge._documentation) > 40
        line = next(line for line in table.splitlines() if line.startswith(f"| `{gauge._name}` |"))
        assert line.startswith(f"| `{gauge._name}` | gauge | {', '.join(labels)}")
        assert " ".join(gauge._documentation.split()) in line
    assert metrics.HELD_BACK_REASONS == ("concurrency", "scheduled")


@pytest.mark.server_only
def test_a_running_supervisor_exports_the_limits_and_the_dashboard_charts_them(dsn, conn, runs, prometheus):
    seed(conn)
    # The supervisor serves another queue: the jobs stay as seeded.
    run = runs(dsn, "--queues", "elsewhere", "--workers", "1")
    parsed = wait_for(lambda: (lambda p: p if limit_samples(p) else None)(run.try_scrape()), timeout=30,
                      message="the limits' gauges scraped")
    assert limit_samples(parsed) == expected(export=(2, 2, 0, 0, 3, 1), sync=(3, 0, 1, 0, 1, 0),
                                             rated=(1, 0, 0, 10 / 60, 2, 0))
    # One series per kind (and reason): never one per concurrency key.
    for name in LIMIT_GAUGES:
        for (sample, labels), _value in parsed.items():
            if sample == name:
                assert {k for k, _v in labels} == ({"kind", "reason"} if name == "pgfence_jobs_held_back" else
                                                   {"kind"}), (name, labels)
    assert total(parsed, "pgfence_jobs_held_back", kind=EXPORT) == 4

    url = prometheus(run.port)
    panels = panel_queries()
    slots, held = panels["Slots in use and limit, by kind"], panels["Jobs held back, by kind and reason"]

    def by(expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(r["metric"][label] for label in labels): float(r["value"][1]) for r in query(url, expr)
                if r["metric"].get("kind") in KINDS}

    wait_for(lambda: by(slots[0], "kind"), timeout=30, message="Prometheus scraped the gauges")
    assert by(slots[0], "kind") == {(EXPORT,): 2, (SYNC,): 3, (RATED,): 1}
    # The limits: a kind without one shows no line (0 is none).
    assert by(slots[1], "kind") == {(EXPORT,): 2}
    assert by(slots[2], "kind") == {(SYNC,): 1}
    assert by(held[0], "kind", "reason") == {(EXPORT, "concurrency"): 3, (EXPORT, "scheduled"): 1,
                                             (SYNC, "concurrency"): 1, (SYNC, "scheduled"): 0,
                                             (RATED, "concurrency"): 2, (RATED, "scheduled"): 0}
    # The rate, through Prometheus as exact as the row holds it.
    assert by("max by (kind) (pgfence_limit_rate_per_second)", "kind") == {(EXPORT,): 0, (SYNC,): 0,
                                                                          (RATED,): 10 / 60}


# -- the dashboard ----------------------------------------------------------------------

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from pgfence.web import auth  # noqa: E402
from pgfence.web.app import create_app  # noqa: E402

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


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


def flash(page: str) -> str | None:
    match = re.search(r'<p id="flash" class="flash">(.*?)</p>', page, re.S)
    return htmllib.unescape(match.group(1)) if match else None


CELLS = ("concurrency", "per-key", "rate", "source", "declared", "running", "admitted", "waiting", "scheduled", "keys")
#: The "handler declares" cell of a kind whose handler declares nothing.
NOTHING = "concurrency -, per key -, rate -"


def limit_rows(page: str) -> dict[str, dict[str, str]]:
    """kind -> {cell class: text} of the Limits page's table."""
    rows = {}
    for kind, body in re.findall(r'<tr data-kind="([^"]*)">(.*?)</tr>', page, re.S):
        cells = dict(re.findall(r'<td class="(?:num )?([a-z-]+)">(.*?)</td>', body, re.S))
        rows[htmllib.unescape(kind)] = {name: htmllib.unescape(cells[name]) for name in CELLS}
    return rows


def errors(page: str) -> list[str]:
    """The error messages a page shows."""
    return [htmllib.unescape(m) for m in re.findall(r'class="error">(.*?)</p>', page, re.S)]


def limits_table(conn) -> list[tuple]:
    return conn.execute("SELECT * FROM pgfence.limits ORDER BY kind").fetchall()


def test_the_limits_page_lists_every_kind_with_limits_and_their_use(dsn, conn):
    seed(conn)
    # A limits row written by hand with a kind no job could have: escaped.
    conn.execute("INSERT INTO pgfence.limits (kind, set_concurrency, updated_by) VALUES (%s, 1, %s)", (SCRIPT, IMG))
    with client(dsn) as c:
        overview = c.get("/").text
        assert '<a id="nav-limits" href="/limits">Limits</a>' in overview
        page = c.get("/limits").text
    assert limit_rows(page) == {
        SCRIPT: {"concurrency": "1", "per-key": "-", "rate": "-", "source": "set", "declared": NOTHING,
                 "running": "0", "admitted": "0", "waiting": "0", "scheduled": "0", "keys": "0"},
        EXPORT: {"concurrency": "2", "per-key": "-", "rate": "-", "source": "set", "declared": NOTHING,
                 "running": "1", "admitted": "1", "waiting": "3", "scheduled": "1", "keys": "0"},
        RATED: {"concurrency": "-", "per-key": "-", "rate": "10/min", "source": "handler",
                "declared": "concurrency -, per key -, rate 10/min", "running": "0", "admitted": "1",
                "waiting": "2", "scheduled": "0", "keys": "0"},
        SYNC: {"concurrency": "-", "per-key": "1", "rate": "-", "source": "handler",
               "declared": "concurrency -, per key 1, rate -", "running": "0", "admitted": "3", "waiting": "1",
               "scheduled": "0", "keys": "3"},
    }
    assert '<th class="num">per key</th><th class="num">rate</th><th>source</th><th>handler declares</th>' in page
    assert SCRIPT not in page and IMG not in page
    assert htmllib.escape(SCRIPT) in page
    # A kind set at run time can be reset; one from its handler has nothing to reset.
    assert re.findall(r'data-action="reset" data-kind="([^"]*)"', page) == [htmllib.escape(SCRIPT), EXPORT]
    assert page.count('id="limits-set"') == 1
    assert page.count('<input type="text" name="rate" maxlength="40" placeholder="100/s" value="">') == 1


def test_the_limits_page_without_limits_says_so(dsn):
    with client(dsn) as c:
        page = c.get("/limits").text
    assert limit_rows(page) == {}
    assert '<tr class="empty"><td colspan="13">no concurrency or rate limits' in page


def test_a_job_page_says_why_it_is_held_back_and_shows_its_key(dsn, conn):
    ids = seed(conn)
    with client(dsn) as c:
        pages = {job_id: c.get(f"/jobs/{job_id}").text for job_id in (*ids[EXPORT], *ids[SYNC])}

    def field(page: str, name: str) -> str | None:
        match = re.search(rf'<dd data-field="{name}"[^>]*>(.*?)</dd>', page, re.S)
        return htmllib.unescape(match.group(1)) if match else None

    held = {job_id: field(page, "held_back") for job_id, page in pages.items()}
    export, sync = ids[EXPORT], ids[SYNC]
    waiting = 'waiting for a concurrency slot (<a href="/limits">limits</a>)'
    assert held == {export[0]: None, export[1]: None, export[2]: waiting, export[3]: waiting, export[4]: waiting,
                    export[5]: 'held until its run_at (<a href="/limits">limits</a>)',
                    sync[0]: None, sync[1]: waiting, sync[2]: None, sync[3]: None}
    keys = {job_id: field(page, "concurrency_key") for job_id, page in pages.items()}
    assert keys == {**{job_id: None for job_id in export}, sync[0]: "a", sync[1]: "a", sync[2]: "b", sync[3]: IMG}
    assert IMG not in pages[sync[3]]


def test_the_set_form_changes_a_kinds_limits_with_its_csrf_token(dsn, conn):
    ids = seed(conn)
    with client(dsn) as c:
        token = csrf_of(c.get("/limits").text)
        response = c.post("/limits/set", data={"csrf_token": token, "kind": EXPORT, "concurrency": " 3 ",
                                               "per_key": "", "rate": " 100/s "})
        assert (response.status_code, response.headers["location"]) == (303, "/limits")
        page = c.get("/limits").text
        assert flash(page) == f"set the limits of kind {EXPORT}: concurrency 3, per key -, rate 100/s"
        assert limit_rows(page)[EXPORT] == {"concurrency": "3", "per-key": "-", "rate": "100/s", "source": "set",
                                            "declared": NOTHING, "running": "1", "admitted": "2", "waiting": "2",
                                            "scheduled": "1", "keys": "0"}
        # Admitted at once: the job that waited first holds the new slot.
        assert scalar(conn, "SELECT held_back FROM pgfence.jobs WHERE id = %s", (ids[EXPORT][2],)) is None
        # Recorded with who did it, as the audit of bulk actions names them.
        assert conn.execute("SELECT set_concurrency, set_per_key, set_rate_count, set_rate_period, updated_by "
                            "FROM pgfence.limits WHERE kind = %s", (EXPORT,)).fetchone() == \
            (3, None, 100, 1.0, "pgfence web from testclient")

        # A rate set over the handler's: in force until reset, the handler's
        # still shown.  A burst of one start, taken by the job admitted and
        # not claimed: the two waiting jobs stay so.
        response = c.post("/limits/set", data={"csrf_token": token, "kind": RATED, "rate": "1/s"})
        assert response.status_code == 303
        page = c.get("/limits").text
        assert flash(page) == f"set the limits of kind {RATED}: concurrency -, per key -, rate 1/s"
        rated = {"concurrency": "-", "per-key": "-", "rate": "1/s", "source": "set",
                 "declared": "concurrency -, per key -, rate 10/min", "running": "0", "admitted": "1",
                 "waiting": "2", "scheduled": "0", "keys": "0"}
        assert limit_rows(page)[RATED] == rated
        assert conn.execute("SELECT set_rate_count, set_rate_period, declared_rate_count, declared_rate_period, "
                            "rate_count, rate_period FROM pgfence.limits WHERE kind = %s",
                            (RATED,)).fetchone() == (1, 1.0, 10, 60.0, 1, 1.0)
        assert c.post("/limits/reset", data={"csrf_token": token, "kind": RATED}).status_code == 303
        page = c.get("/limits").text
        assert flash(page) == (f"reset the limits of kind {RATED} to its handler's: "
                               "concurrency -, per key -, rate 10/min")
        assert limit_rows(page)[RATED] == rated | {"rate": "10/min", "source": "handler"}
        assert conn.execute("SELECT set_rate_count, set_rate_period, rate_count, rate_period FROM pgfence.limits "
                            "WHERE kind = %s", (RATED,)).fetchone() == (None, None, 10, 60.0)

        # A kind without limits gets them: its queued jobs are gated at once.
        free = [pgfence.enqueue(conn, "t_vis_new", concurrency_key="k") for _ in range(2)]
        assert c.post("/limits/set", data={"csrf_token": token, "kind": "t_vis_new",
                                           "per_key": "1"}).status_code == 303
        page = c.get("/limits").text
        assert limit_rows(page)["t_vis_new"] == {"concurrency": "-", "per-key": "1", "rate": "-", "source": "set",
                                                 "declared": NOTHING, "running": "0", "admitted": "1",
                                                 "waiting": "1", "scheduled": "0", "keys": "1"}
        assert [scalar(conn, "SELECT held_back FROM pgfence.jobs WHERE id = %s", (i,)) for i in free] == \
            [None, "concurrency"]

        # Reset: SYNC's set limit goes, its handler's applies again.
        assert c.post("/limits/set", data={"csrf_token": token, "kind": SYNC, "per_key": "5"}).status_code == 303
        assert limit_rows(c.get("/limits").text)[SYNC]["per-key"] == "5"
        response = c.post("/limits/reset", data={"csrf_token": token, "kind": SYNC})
        assert response.status_code == 303
        page = c.get("/limits").text
        assert flash(page) == f"reset the limits of kind {SYNC} to its handler's: concurrency -, per key 1, rate -"
        # The second job of key a, admitted under 5, keeps its slot: a lowered
        # limit stops no holder.
        assert limit_rows(page)[SYNC] == {"concurrency": "-", "per-key": "1", "rate": "-", "source": "handler",
                                          "declared": "concurrency -, per key 1, rate -", "running": "0",
                                          "admitted": "4", "waiting": "0", "scheduled": "0", "keys": "3"}


@pytest.mark.parametrize(("form", "message"), [
    ({"kind": EXPORT, "concurrency": "0"}, "invalid concurrency: must be at least 1 (and at most 2147483647), got 0"),
    ({"kind": EXPORT, "per_key": "0"}, "invalid per-key concurrency: must be at least 1 (and at most 2147483647), got 0"),
    ({"kind": EXPORT, "concurrency": "-1"}, "invalid concurrency: must be a whole number, got '-1'"),
    ({"kind": EXPORT, "concurrency": "2.5"}, "invalid concurrency: must be a whole number, got '2.5'"),
    ({"kind": EXPORT, "concurrency": "3", "per_key": "x"}, "invalid per-key concurrency: must be a whole number, "
                                                           "got 'x'"),
    ({"kind": EXPORT, "concurrency": "2147483648"}, "invalid concurrency: must be at least 1 (and at most "
                                                    "2147483647), got 2147483648"),
    ({"kind": EXPORT, "rate": "fast"}, BAD_RATE.format("fast")),
    ({"kind": EXPORT, "rate": "0/s"}, BAD_RATE.format("0/s")),
    ({"kind": EXPORT, "rate": "2147483648/s"}, BAD_RATE.format("2147483648/s")),
    ({"kind": EXPORT, "rate": "100/S"}, BAD_RATE.format("100/S")),
    ({"kind": EXPORT, "concurrency": "3", "rate": " 10/fortnight "}, BAD_RATE.format("10/fortnight")),
    ({"kind": EXPORT, "concurrency": "", "per_key": " ", "rate": "  "},
     "give a concurrency, a per-key concurrency, a rate, or several"),
    ({"kind": "", "concurrency": "3"}, "give the kind whose limits to set"),
    ({"kind": "bad kind", "concurrency": "3"}, "invalid kind name 'bad kind': must be 1 to 128 letters, digits, "
                                               "'_', '.', ':' or '-', starting with a letter or a digit"),
], ids=["zero", "per-key-zero", "negative", "fraction", "not-a-number", "too-large", "rate-not-a-rate", "rate-zero",
        "rate-too-large", "rate-unit-case", "rate-bad-unit", "no-limit", "no-kind", "bad-kind"])
def test_bad_input_in_the_set_form_is_one_message_and_writes_nothing(dsn, conn, form, message):
    seed(conn)
    before = limits_table(conn)
    jobs = conn.execute("SELECT id, gated, held_back FROM pgfence.jobs ORDER BY id").fetchall()
    with client(dsn) as c:
        token = csrf_of(c.get("/limits").text)
        response = c.post("/limits/set", data={"csrf_token": token, **form})
    assert response.status_code == 400
    page = response.text
    assert errors(page) == [message]
    # The page comes back with what was typed, to correct it.
    assert f'name="kind" required maxlength="128" list="limited-kinds" value="{htmllib.escape(form["kind"])}"' in page
    assert f'name="rate" maxlength="40" placeholder="100/s" value="{htmllib.escape(form.get("rate", ""))}"' in page
    assert (limit_rows(page)[EXPORT]["concurrency"], limit_rows(page)[EXPORT]["rate"]) == ("2", "-")
    assert limits_table(conn) == before
    assert conn.execute("SELECT id, gated, held_back FROM pgfence.jobs ORDER BY id").fetchall() == jobs


def test_the_limit_forms_refuse_a_post_without_a_valid_csrf_token(dsn, conn):
    seed(conn)
    before = limits_table(conn)
    with client(dsn) as c:
        token = csrf_of(c.get("/limits").text)
        for data in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64},
                     {"csrf_token": auth.Signer().csrf_token("another-nonce")}):
            for url, fields in (("/limits/set", {"kind": EXPORT, "concurrency": "5"}),
                                ("/limits/set", {"kind": RATED, "rate": "100/s"}),
                                ("/limits/reset", {"kind": EXPORT})):
                assert c.post(url, data=fields | data).status_code == 403, (url, data)
        # The right token without its cookie (another site's form) is refused too.
        bare = TestClient(c.app, follow_redirects=False)
        assert bare.post("/limits/set", data={"csrf_token": token, "kind": EXPORT,
                                              "concurrency": "5"}).status_code == 403
        assert bare.post("/limits/set", data={"csrf_token": token, "kind": RATED,
                                              "rate": "100/s"}).status_code == 403
    assert limits_table(conn) == before


def test_reset_of_a_kind_without_limits_is_refused_and_read_only_shows_no_form(dsn, conn):
    seed(conn)
    before = limits_table(conn)
    secret = b"s" * 32
    with client(dsn, secret=secret) as c:
        token = csrf_of(c.get("/limits").text)
        cookie = c.cookies.get(auth.CSRF_COOKIE)
        response = c.post("/limits/reset", data={"csrf_token": token, "kind": "t_vis_none"})
        assert response.status_code == 400
        assert errors(response.text) == ["kind 't_vis_none' has no limits to reset"]
        response = c.post("/limits/reset", data={"csrf_token": token, "kind": "no good"})
        assert response.status_code == 400
        assert errors(response.text) == ["invalid kind name 'no good': must be 1 to 128 letters, digits, '_', '.', "
                                         "':' or '-', starting with a letter or a digit"]
    with client(dsn, read_only=True, secret=secret) as c:
        page = c.get("/limits").text
        assert 'method="post"' not in page and 'id="limits-set"' not in page and "data-action" not in page
        assert 'name="rate"' not in page
        assert limit_rows(page)[EXPORT]["concurrency"] == "2"
        assert limit_rows(page)[RATED]["rate"] == "10/min"
        c.cookies.set(auth.CSRF_COOKIE, cookie)
        for url, fields in (("/limits/set", {"kind": EXPORT, "concurrency": "5"}),
                            ("/limits/set", {"kind": RATED, "rate": "100/s"}), ("/limits/reset", {"kind": EXPORT})):
            assert c.post(url, data=fields | {"csrf_token": token}).status_code == 403
    assert limits_table(conn) == before


# -- pgfence status ----------------------------------------------------------------------


@pytest.mark.server_only
def test_status_shows_the_limits_when_any_exists(dsn, conn):
    out = run_pgfence("status", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    assert "limit" not in out.stdout
    seed(conn)

    out = run_pgfence("status", "--json", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    data = json.loads(out.stdout)
    assert data["queues"] == {"default": {"queued": 12, "running": 1}}
    assert data["limits"] == [
        {"kind": EXPORT, "concurrency": 2, "per_key_concurrency": None, "rate": None, "in_use": 2, "running": 1,
         "admitted": 1, "waiting": 3, "scheduled": 1},
        {"kind": RATED, "concurrency": None, "per_key_concurrency": None, "rate": "10/min", "in_use": 1,
         "running": 0, "admitted": 1, "waiting": 2, "scheduled": 0},
        {"kind": SYNC, "concurrency": None, "per_key_concurrency": 1, "rate": None, "in_use": 3, "running": 0,
         "admitted": 3, "waiting": 1, "scheduled": 0},
    ]

    out = run_pgfence("status", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    lines = out.stdout.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("kind ")))
    assert lines[at - 1] == ""
    assert [line.split() for line in lines[at:]] == [
        ["kind", "limit", "per", "key", "rate", "in", "use", "waiting", "scheduled"],
        [EXPORT, "2", "-", "-", "2", "3", "1"],
        [RATED, "-", "-", "10/min", "1", "2", "0"],
        [SYNC, "-", "1", "-", "3", "1", "0"],
    ]
    # The columns line up under their heads, the rate's too.
    head = lines[at]
    assert lines[at + 2][:head.index(" rate") + len(" rate")].endswith("10/min")

    # A rate set at run time (not a whole unit) shows as written back.
    admin.set_limits(conn, RATED, rate="5/2h", by="test")
    out = run_pgfence("status", "--json", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    assert [(r["kind"], r["rate"]) for r in json.loads(out.stdout)["limits"]] == \
        [(EXPORT, None), (RATED, "5/7200s"), (SYNC, None)]
