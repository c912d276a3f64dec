"""The Grafana dashboard (grafana/dashboards/pgfence.json) and its
provisioning: loadable by file provisioning (a datasource variable, no
``${DS_...}`` import inputs), well-formed panels, and PromQL that parses
(promtool) and uses only metrics pgfence exports."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from promql import (
    ROOT,
    check_exprs,
    exported_series,
    metric_names,
    metric_objects,
    strip_strings,
    unknown_names,
)

DASHBOARD = ROOT / "grafana" / "dashboards" / "pgfence.json"
PROVISIONING = ROOT / "grafana" / "provisioning"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside (collapsed) rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def data_panels(dashboard: dict) -> list[dict]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def exprs(dashboard: dict) -> dict[str, str]:
    """Every PromQL expression of the dashboard, keyed by where it is."""
    out = {}
    for panel in data_panels(dashboard):
        for target in panel["targets"]:
            out[f"panel {panel['id']} ({panel['title']}) target {target['refId']}"] = target["expr"]
    return out


def variable_queries(dashboard: dict) -> dict[str, str]:
    """The series selectors inside the query variables' label_values(...)."""
    out = {}
    for name, var in variables(dashboard).items():
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", query)
            assert m, f"variable {name}: {query!r} is not label_values(selector, label)"
            out[f"variable {name}"] = m.group(1)
    return out


# Grafana's own interval variables, and the dashboard's variables, are
# replaced by values PromQL accepts before promtool sees the expression.
_INTERVALS = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def to_promql(expr: str, names: set[str]) -> str:
    expr = _INTERVALS.sub("5m", expr)
    # Template variables are only used inside label matcher strings ("=~").
    for var in _VARIABLE.findall(expr):
        assert var in names, f"unknown variable ${var} in {expr!r}"
    outside = strip_strings(expr)
    assert "$" not in outside, f"a variable outside a label matcher: {expr!r}"
    return _VARIABLE.sub(".*", expr)


def test_identity(dashboard):
    assert dashboard["uid"] == "pgfence"
    assert dashboard["title"] == "pgfence"
    assert type(dashboard["schemaVersion"]) is int and dashboard["schemaVersion"] >= 36
    assert dashboard.get("id") is None


def test_loads_by_file_provisioning(dashboard):
    """No import-time inputs: a provisioned dashboard never gets them filled in."""
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    assert "${DS_" not in DASHBOARD.read_text()
    var = variables(dashboard)["datasource"]
    assert var["type"] == "datasource"
    assert var["query"] == "prometheus"


def test_every_panel_and_target_uses_the_datasource_variable(dashboard):
    panels = data_panels(dashboard)
    assert panels
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
            assert target["expr"].strip(), (panel["title"], target["refId"])
    for name, var in variables(dashboard).items():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, name


def test_panel_ids_and_grid(dashboard):
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert all(type(i) is int for i in ids)
    assert len(ids) == len(set(ids)), sorted(ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid), panel["title"]
        assert all(type(grid[k]) is int for k in "hwxy"), panel["title"]
        assert grid["h"] > 0 and grid["w"] > 0 and grid["x"] >= 0 and grid["y"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_rows(dashboard):
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Reclaims & safety", "Throughput", "Wait and run time", "Queues", "Workers", "Saturation",
                    "Heartbeat", "Vacuum", "Periodic jobs", "Concurrency limits"]


def test_variables(dashboard):
    vars_ = variables(dashboard)
    assert set(vars_) == {"datasource", "instance", "queue"}
    assert variable_queries(dashboard) == {
        "variable instance": "pgfence_workers",
        "variable queue": 'pgfence_queue_jobs{instance=~"$instance"}',
    }
    for name in ("instance", "queue"):
        assert vars_[name]["multi"] and vars_[name]["includeAll"] and vars_[name]["allValue"] == ".*"


def test_exprs_use_only_exported_metrics(dashboard):
    found = {**exprs(dashboard), **variable_queries(dashboard)}
    for where, expr in found.items():
        assert metric_names(expr), f"{where}: uses no pgfence metric: {expr}"
        assert unknown_names(expr) == set(), f"{where}: not exported by pgfence: {expr}"


def test_every_metric_is_charted(dashboard):
    """A metric added to supervisor.metrics shows up here as missing from the dashboard."""
    series = exported_series()
    used = {series[n] for expr in exprs(dashboard).values() for n in metric_names(expr) if n in series}
    assert used == set(metric_objects())


def test_counters_and_histograms_are_rated(dashboard):
    """Counters and histogram buckets only inside rate()/increase(); gauges
    never; buckets aggregated by le."""
    series = exported_series()
    types = {name: m._type for name, m in metric_objects().items()}
    for where, expr in exprs(dashboard).items():
        text = strip_strings(expr)
        for m in re.finditer(r"(?<![A-Za-z0-9_:])(pgfence_[A-Za-z0-9_:]*)", text):
            if m.group(1) not in series:
                continue  # reported by test_exprs_use_only_exported_metrics
            kind = types[series[m.group(1)]]
            wrapped = re.search(r"\b(rate|increase)\(\s*$", text[: m.start()]) is not None
            if kind in ("counter", "histogram"):
                assert wrapped, f"{where}: {m.group(1)} not inside rate()/increase(): {expr}"
            else:
                assert not wrapped, f"{where}: gauge {m.group(1)} inside rate()/increase(): {expr}"
        if "_bucket" in text:
            assert text.startswith("histogram_quantile("), f"{where}: {expr}"
            assert re.search(r"\bby \([^)]*\ble\b", text), f"{where}: buckets not summed by le: {expr}"


def test_exprs_parse(dashboard, tmp_path):
    names = set(variables(dashboard))
    found = {**exprs(dashboard), **variable_queries(dashboard)}
    promql = {where: to_promql(expr, names) for where, expr in found.items()}
    result = check_exprs(promql, tmp_path)
    index = "\n".join(f"expr_{i}: {where}" for i, where in enumerate(promql))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{index}"
    assert f"SUCCESS: {len(promql)} rules found" in result.stdout, result.stdout


def test_promql_checker_rejects_bad_syntax(tmp_path):
    """The check above can fail: promtool refuses a broken expression."""
    result = check_exprs({"bad": "sum by (queue) (rate(pgfence_jobs_claimed_total[5m])"}, tmp_path)
    assert result.returncode != 0


def test_provisioning():
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "pgfence.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/pgfence"
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
