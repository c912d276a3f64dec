"""Helpers for the tests of the Grafana dashboard and the Prometheus rules:
the series names pgfence exports (read from ``supervisor.metrics``, never
listed twice), the metric names a PromQL expression uses, and promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

ROOT = Path(__file__).resolve().parent.parent

#: The series a metric of each type is exported as, by suffix of its name
#: (prometheus_client also writes ``_created`` series, which the multiprocess
#: collector that serves pgfence's /metrics leaves out).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}


def metric_objects() -> dict[str, MetricWrapperBase]:
    """pgfence's metric objects by name (``_name``: a counter's has no ``_total``)."""
    from pgfence.observe import metrics

    found = {v._name: v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)}
    assert found, "pgfence.observe.metrics defines no prometheus_client metric"
    return found


def exported_series() -> dict[str, str]:
    """Every series name pgfence exports, mapped to its metric's name."""
    series: dict[str, str] = {}
    for name, metric in metric_objects().items():
        assert metric._type in _SUFFIXES, f"{name}: metric type {metric._type!r} not known to tests/promql.py"
        for suffix in _SUFFIXES[metric._type]:
            series[name + suffix] = name
    return series


def metric_type(series: str) -> str:
    """The type of the metric an exported series belongs to."""
    return metric_objects()[exported_series()[series]]._type


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME = re.compile(r"(?<![A-Za-z0-9_:$])pgfence_[A-Za-z0-9_:]*")


def strip_strings(expr: str) -> str:
    """The expression with every string literal (label values, regexes) emptied."""
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """The pgfence metric names an expression uses (outside string literals)."""
    return set(_NAME.findall(strip_strings(expr)))


def unknown_names(expr: str) -> set[str]:
    """The pgfence_ names in an expression that pgfence does not export."""
    return metric_names(expr) - set(exported_series())


def promtool() -> str:
    """promtool's path; the test fails (never skips) without it."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH: install it with `apt-get install -y prometheus` "
                    "(Debian's package ships promtool)", pytrace=False)
    return path


def run_promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=60)


def check_exprs(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Check the PromQL syntax of every expression with ``promtool check rules``:
    one recording rule per expression, named after its key."""
    lines = ["groups:", "  - name: exprs", "    rules:"]
    for i, expr in enumerate(exprs.values()):
        # A block scalar keeps the expression verbatim, quotes and all.
        lines += [f"      - record: expr_{i}", "        expr: |-"]
        lines += [f"          {line}" for line in expr.splitlines()]
    rules = tmp_path / "exprs.rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    return run_promtool("check", "rules", str(rules))
