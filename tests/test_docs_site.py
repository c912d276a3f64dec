"""The documentation site: it builds strict (no broken link or anchor), its
generated reference pages follow the code, and the pages written by hand
name nothing the code does not have."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pgtools import ROOT

sys.path.insert(0, str(ROOT / "docs" / "_gen"))
import reference  # docs/_gen/reference.py: what the docs' hook renders

DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or not MKDOCS.exists():
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' to build the documentation")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                           timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_site_builds_strict_with_the_generated_pages(site):
    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "PGFENCE_LEASE" in settings and "<!-- generated" not in settings
    cli = _text((site / "reference" / "cli" / "index.html").read_text())
    for command in reference.cli_commands():
        assert f"pgfence {command}" in cli
    assert "--any-kind" in cli
    sql = _text((site / "reference" / "sql" / "index.html").read_text())
    for name in reference.sql_functions():
        assert name in sql, f"the SQL reference does not name {name}"
    assert "pgfence_double_run_prevented_total" in (site / "reference" / "metrics" / "index.html").read_text()
    api = _text((site / "reference" / "python-api" / "index.html").read_text())
    assert "fenced_writes" in api and "idempotency_key" in api and ":meth:" not in api
    # The repository's files that pages link to are published with the site.
    assert (site / "repo" / "bench" / "index.html").exists()
    assert (site / "repo" / "deploy" / "systemd" / "pgfence.service").exists()


def test_every_function_and_table_of_the_schema_is_in_the_sql_reference(conn):
    """The SQL reference lists what reference.sql_functions() reads from
    the migrations (test above): that is every function of schema pgfence."""
    rows = conn.execute("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                        "WHERE n.nspname = %s", ("pgfence",)).fetchall()
    assert sorted(f"pgfence.{name}" for (name,) in rows) == sorted(reference.sql_functions())
    # And the page's table of what to read names every table and view (a
    # day partition of history is job_history's).
    page = (DOCS / "reference" / "sql.md").read_text()
    table = page[page.index("## What to read"):page.index("## `pgfence.complete_fenced`")]
    relations = conn.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v') AND NOT c.relispartition",
                             ("pgfence",)).fetchall()
    for (name,) in relations:
        assert f"`pgfence.{name}`" in table, f"docs/reference/sql.md does not say what pgfence.{name} holds"
    enqueue = reference.sql_functions()["pgfence.enqueue"]
    assert "p_dedupe_key" in enqueue.signature and enqueue.signature.endswith("RETURNS bigint")


def test_the_command_table_written_by_hand_has_every_command():
    page = (DOCS / "reference" / "cli.md").read_text()
    table = page[page.index("## What each command does"):page.index("## Which database")]
    named = set(re.findall(r"^\| `pgfence (\w+)", table, re.MULTILINE))
    named |= set(re.findall(r"`pgfence (\w+)[^`]*` / `pgfence (\w+)", table)[0])
    assert named >= set(reference.cli_commands()) - {"embedded"} and "embedded status" in table


def test_the_metrics_named_by_the_pages_exist():
    from prometheus_client.metrics import MetricWrapperBase

    from pgfence.observe import metrics

    known: set[str] = set()
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            known.add(metric._name + ("_total" if metric._type == "counter" else ""))
    for page in sorted(DOCS.rglob("*.md")):
        for head, star, braces, tail in re.findall(r"\b(pgfence_[a-z_]*[a-z])(_\*)?(?:\{([a-z_,]+)\}([a-z_]*))?",
                                                   page.read_text()):
            if star:            # pgfence_queue_*: some metrics start so
                assert any(k.startswith(head + "_") for k in known), f"{page.relative_to(ROOT)} names {head}_*"
                continue
            if tail:            # pgfence_jobs_{claimed,completed}_total: one name each
                names = [head + one + tail for one in braces.split(",")]
            else:               # pgfence_lease_lost_total{reason}: labels
                names = [head]
            for one in names:
                if one in ("pgfence_jobs", "pgfence_pauses") or one.startswith(("pgfence_examples", "pgfence_bench")):
                    continue    # a NOTIFY channel, a schema or a database, not a metric
                assert one in known, f"{page.relative_to(ROOT)} names {one}, which is not a metric"
