"""A real Prometheus server scrapes a real `pgfence run`; every dashboard
panel's query is evaluated through Prometheus's HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse

import pytest

from metricstools import free_port, http_get, reclaim_and_reject, total
from pgtools import ROOT, wait_for

DASHBOARD = ROOT / "grafana" / "dashboards" / "pgfence.json"
RULES = ROOT / "deploy" / "prometheus" / "pgfence-rules.yml"


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on loopback; yields (url, write_config) ."""
    binary = shutil.which("prometheus")
    assert binary, "the prometheus server is missing: apt-get install prometheus (.ci/run does)"
    port = free_port()
    procs = []

    def start(target_port: int) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({   # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "pgfence",
                                "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
        }))
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, timeout=30, message="prometheus ready")
        return url

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(url: str, expr: str) -> list[dict]:
    status, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body) if body else {}
    assert status == 200 and data.get("status") == "success", (expr, status, body[:300])
    return data["data"]["result"]


def panel_queries() -> dict[str, list[str]]:
    """Every panel's PromQL, as Grafana would send it with 'All' selected."""
    dashboard = json.loads(DASHBOARD.read_text())
    out: dict[str, list[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$__rate_interval", "15s").replace("$__range", "10m")
                    .replace("$queue", ".*").replace("$instance", ".*"))
            out.setdefault(panel["title"], []).append(expr)
    return out


def value(url: str, expr: str) -> float:
    result = query(url, expr)
    return sum(float(r["value"][1]) for r in result)


def test_dashboard_panels_show_one_reclaim_and_one_fenced_rejection(dsn, conn, runs, prometheus):
    run = runs(dsn, "--workers", "2", "--lease", "1.5")
    url = prometheus(run.port)
    # Counters start at 0 (the arbiter creates them), and Prometheus must
    # have seen the zeros, so that increase() counts the first event.
    wait_for(lambda: query(url, 'pgfence_reclaims_total{kind="stubborn"}'), timeout=30, message="first scrape")
    reclaim_and_reject(conn)
    wait_for(lambda: value(url, "sum(pgfence_double_run_prevented_total)") == 1
             and value(url, "sum(pgfence_reclaims_total)") == 1
             and value(url, "sum(pgfence_lease_lost_total)") == 1
             and value(url, "sum(pgfence_jobs_completed_total)") == 1, timeout=30, message="the events scraped")
    # The scrape agrees with the endpoint itself.
    parsed = run.scrape()
    assert total(parsed, "pgfence_reclaims_total") == 1

    panels = panel_queries()
    results = {title: [query(url, expr) for expr in exprs] for title, exprs in panels.items()}
    assert len(results) >= 20
    # The three safety panels show exactly what happened.  increase() over a
    # range extrapolates a little at its edges; the count is what it rounds to.
    assert round(value(url, panels["Reclaims in range"][0])) == 1
    assert round(value(url, panels["Double runs prevented in range"][0])) == 1
    lost = query(url, panels["Leases lost in range, by reason"][0])
    by_reason = {r["metric"]["reason"]: round(float(r["value"][1])) for r in lost}
    assert sum(by_reason.values()) == 1
    # The stubborn worker learns of its loss from the rejected renewal, the
    # fence, or its own deadline passing unrenewed ("expired"), whichever
    # comes first.
    assert {k for k, v in by_reason.items() if v} <= {"fence_rejected", "renewal_rejected", "expired"}
    # The rate panels saw the event too (within the last minute).
    for title in ("Reclaims /s", "Double runs prevented /s", "Leases lost /s by reason"):
        expr = panels[title][0].replace("[15s]", "[1m]")
        assert value(url, expr) > 0, title
    # Panels about throughput and workers have data.
    assert value(url, panels["Live workers"][0]) == 2
    # The saturation row: two one-job workers are a capacity of 2; once both
    # are idle again, nothing is in flight and both slots are free.
    assert value(url, panels["Jobs in flight by queue, and capacity"][1]) == 2
    wait_for(lambda: value(url, panels["Free slots now"][0]) == 2
             and value(url, panels["Saturation now"][0]) == 0
             and value(url, panels["Jobs in flight by queue, and capacity"][0]) == 0,
             timeout=30, message="both workers idle on the saturation panels")
    assert query(url, panels["Saturation by instance (in flight / capacity)"][0])
    assert round(value(url, panels["Claimed and completed /s by queue"][1].replace("[15s]", "[1m]")) * 60) >= 1
    # The vacuum row: the metrics server's first refresh read the table's
    # state; this test's database leaves the table's autovacuum on.
    by_setting = {r["metric"]["setting"]: float(r["value"][1])
                  for r in query(url, panels["Autovacuum for pgfence.jobs"][0])}
    server_on = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()[0]
    assert by_setting == {"server": float(server_on), "table": 1.0}
    assert value(url, panels["Dead and live row versions in pgfence.jobs"][1]) >= 0
    assert query(url, panels["xmin horizon held, and time since the last vacuum"][0])
    assert value(url, panels["xmin horizon held, and time since the last vacuum"][1]) > 0
    assert {r["metric"]["result"] for r in query(url, panels["pgfence's own VACUUMs"][0])} == \
        {"done", "held", "skipped"}
    # The alert on prevented double runs fires within its evaluation.
    wait_for(lambda: any(a["labels"]["alertname"] == "PgfenceDoubleRunPrevented"
                         for a in json.loads(http_get(url + "/api/v1/alerts")[1])["data"]["alerts"]),
             timeout=30, message="PgfenceDoubleRunPrevented alert")
