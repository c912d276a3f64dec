"""The Prometheus alerting rules (deploy/prometheus/pgfence-rules.yml): valid
for promtool, unit-tested by promtool (pgfence-rules.test.yml), every alert
tested both firing and quiet, and every metric they use one pgfence exports."""

from __future__ import annotations

import re

import pytest
import yaml
from promql import ROOT, metric_names, run_promtool, unknown_names

RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "pgfence-rules.yml"
RULE_TESTS = RULES_DIR / "pgfence-rules.test.yml"

ALERTS = {
    "PgfenceDoubleRunPrevented",
    "PgfenceReclaimsHigh",
    "PgfenceJobsFailing",
    "PgfenceQueueBacklogGrowing",
    "PgfenceOldestJobTooOld",
    "PgfenceNoWorkers",
    "PgfenceHeartbeatSlow",
    "PgfenceVacuumBehind",
    "PgfenceXminHorizonHeld",
    "PgfencePeriodicMissedTicks",
    "PgfencePeriodicLastRunFailed",
}


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    assert [g["name"] for g in doc["groups"]] == ["pgfence"]
    return doc["groups"][0]["rules"]


def _alert_tests() -> list[dict]:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    return [case for test in doc["tests"] for case in test.get("alert_rule_test", [])]


def test_promtool_check_rules():
    result = run_promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout, result.stdout


def test_promtool_unit_tests_pass():
    result = run_promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "FAILED" not in result.stdout, result.stdout


def test_alert_names():
    names = [r["alert"] for r in _rules() if "alert" in r]
    assert len(names) == len(set(names)), names
    assert set(names) == ALERTS


def test_rule_tests_load_the_rules_file():
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == [RULES.name]


def test_every_alert_is_tested_firing_and_quiet():
    """A new alert cannot go untested: each one has a case where it fires
    (with exact labels and annotations) and one where it must not."""
    cases = _alert_tests()
    assert {c["alertname"] for c in cases} == {r["alert"] for r in _rules() if "alert" in r}
    for name in ALERTS:
        mine = [c for c in cases if c["alertname"] == name]
        firing = [a for c in mine for a in c.get("exp_alerts") or []]
        assert firing, f"{name}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no test where it stays quiet"
        for alert in firing:
            assert set(alert.get("exp_annotations", {})) == {"summary", "description"}, (name, alert)
            assert "severity" in alert["exp_labels"], (name, alert)


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_severity_and_annotations(name):
    (rule,) = [r for r in _rules() if r.get("alert") == name]
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert set(rule["annotations"]) == {"summary", "description"}


def test_severities():
    severity = {r["alert"]: r["labels"]["severity"] for r in _rules() if "alert" in r}
    assert {n for n, s in severity.items() if s == "critical"} == {"PgfenceNoWorkers"}


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_rule_uses_only_exported_metrics(name):
    (rule,) = [r for r in _rules() if r.get("alert") == name]
    assert metric_names(rule["expr"]), f"{name} uses no pgfence metric"
    assert unknown_names(rule["expr"]) == set(), f"{name} uses metrics pgfence does not export"


def test_test_series_are_exported_metrics():
    """The input series of the unit tests are real pgfence series (a typo there
    would test an alert against a metric that never exists)."""
    doc = yaml.safe_load(RULE_TESTS.read_text())
    for test in doc["tests"]:
        for series in test["input_series"]:
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", series["series"]).group(0)
            if name.startswith("pgfence_"):
                assert unknown_names(name) == set(), series["series"]
