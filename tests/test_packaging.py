"""pgfence as users install it: a wheel, not the source checkout.

The test venv holds the repository as an editable install (a ``.pth`` file
and a meta-path finder), which would shadow the wheel.  So the wheel is
unzipped into a folder of its own (which is what installing a pure-Python
wheel does) and run as ``python -S -m pgfence``: ``-S`` skips ``site``, so
no ``.pth`` runs, and ``PYTHONPATH`` names the unzipped wheel first and the
venv's site-packages (for psycopg and the other dependencies) after it.  The
commands run from a folder outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pgtools import ROOT, scalar, wait_for
from pgfence.store import migrate

#: What the Dockerfile copies into its build stage: all a wheel is built from.
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "supervisor", "handlers", "sql"]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources the Dockerfile copies (so a
    stale ``build/`` of the checkout cannot leak into it)."""
    src = tmp_path_factory.mktemp("wheel-src")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, src / name)
    out = tmp_path_factory.mktemp("wheel-dist")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                            str(src)], capture_output=True, text=True, timeout=300, cwd=out)
    assert built.returncode == 0, built.stdout + built.stderr
    [whl] = out.glob("pgfence-*.whl")
    return whl


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unzipped: its packages, as an installer lays them out."""
    target = tmp_path_factory.mktemp("wheel-installed")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return target


def run_installed(installed: Path, cwd: Path, *args: str, dsn: str | None = None,
                  timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PGFENCE_") and k not in ("DATABASE_URL", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *site.getsitepackages()])
    env["PGFENCE_METRICS_PORT"] = "0"
    if dsn:
        env["PGFENCE_DSN"] = dsn
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_wheel_holds_the_sql_licence_and_entry_point(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read("pgfence-0.2.0.dist-info/entry_points.txt").decode()
        metadata = zf.read("pgfence-0.2.0.dist-info/METADATA").decode()
    migrations = {f"pgfence/sql/migrations/{m.version:04d}_{m.name}.sql" for m in migrate.available()}
    queries = {f"pgfence/sql/queries/{p.name}" for p in (ROOT / "sql" / "queries").glob("*.sql")}
    assert migrations and migrations <= names, migrations - names
    assert queries and queries <= names, queries - names
    # The example handlers' tables are theirs, next to them, not pgfence's.
    # The tools' statements, beside their code in pgfence.tools.
    tools = {"pgfence/tools/demo/demo.sql", "pgfence/tools/loadtest/loadtest.sql"}
    assert tools <= names, tools - names
    assert {n for n in names if n.endswith(".sql")} == migrations | queries | tools | {"pgfence/handlers/tables.sql"}
    # Nothing of the checkout's layout: no top-level sql/, no tests.
    assert not [n for n in names if n.startswith(("sql/", "tests/"))]
    # One import name: nothing at the top level but pgfence and its metadata
    # (supervisord's `supervisor` and a user's `handlers` stay theirs).
    assert {n.split("/")[0] for n in names} == {"pgfence", "pgfence-0.2.0.dist-info"}
    assert "pgfence/py.typed" in names
    # The dashboard's templates and style sheet, read as package resources.
    assert {"pgfence/web/templates/base.html", "pgfence/web/templates/job.html",
            "pgfence/web/static/pgfence.css"} <= names
    assert "pgfence-0.2.0.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata
    assert "pgfence = pgfence.cli.main:main" in entry_points


def test_installed_wheel_migrates_reports_and_works_outside_the_repository(installed, empty_dsn, tmp_path):
    """The regression: a non-editable install failed with KeyError
    'migrations_lock' / 'status_counts' (the SQL folder was a
    ``MultiplexedPath('...')`` turned into a Path through its text)."""
    migrated = run_installed(installed, tmp_path, "-m", "pgfence", "migrate", dsn=empty_dsn)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.splitlines() == [f"applied {m.version:04d}_{m.name}" for m in migrate.available()]

    again = run_installed(installed, tmp_path, "-m", "pgfence", "migrate", dsn=empty_dsn)
    assert (again.returncode, again.stdout) == (0, "schema up to date\n"), again.stderr

    status = run_installed(installed, tmp_path, "-m", "pgfence", "status", "--json", dsn=empty_dsn)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"queues": {}, "running": [], "estimated": False}

    ids = []
    for n in range(3):
        enqueued = run_installed(installed, tmp_path, "-m", "pgfence", "enqueue", "noop",
                                 "--handlers", "pgfence.handlers.builtin", "--payload", json.dumps({"n": n}),
                                 dsn=empty_dsn)
        assert enqueued.returncode == 0, enqueued.stderr
        ids.append(int(enqueued.stdout))
    assert len(set(ids)) == 3

    worked = run_installed(installed, tmp_path, "-m", "pgfence", "work", "--burst", "--retention", "none",
                           "--handlers", "pgfence.handlers.builtin", dsn=empty_dsn)
    assert worked.returncode == 0, worked.stderr

    status = run_installed(installed, tmp_path, "-m", "pgfence", "status", "--json", dsn=empty_dsn)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"queues": {"default": {"done": 3}}, "running": [], "estimated": False}

    # The commands above ran the wheel's code and SQL, not the checkout's.
    where = run_installed(installed, tmp_path, "-c", "import pgfence, pgfence.store.queries as q; "
                          "print(pgfence.__file__); print(q.sql_dir())")
    assert where.returncode == 0, where.stderr
    module_file, sql_dir = where.stdout.split()
    assert Path(module_file) == installed / "pgfence" / "__init__.py"
    assert Path(sql_dir) == installed / "pgfence" / "sql"

    # Nothing was written into the folder the commands ran from.
    assert list(tmp_path.iterdir()) == []


def venv_env(venv: Path) -> dict[str, str]:
    """The environment of a command of ``venv``: nothing of the checkout (no
    PYTHONPATH) and none of the caller's pgfence settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PGFENCE_") and k not in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PGFENCE_METRICS_PORT"] = "0"
    return env


def in_venv(venv: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=venv_env(venv),
                          capture_output=True, text=True, timeout=timeout)


IMPORT_FAILS = """\
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        print(name, "ModuleNotFoundError", exc.name)
    else:
        print(name, "imported")
"""


@pytest.mark.server_only   # what is installed where; the server only answers pgfence run
def test_pgfence_and_supervisord_install_side_by_side(wheel, dsn, conn, tmp_path):
    """pgfence no longer installs a top-level ``supervisor`` (nor
    ``handlers``) package: in a fresh virtual environment holding only
    pgfence neither name imports, and supervisord installed next to it keeps
    its own ``supervisor`` while ``pgfence run`` still works."""
    venv = tmp_path / "venv"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    installed = in_venv(venv, cwd, "pip", "install", "--quiet", str(wheel))
    assert installed.returncode == 0, installed.stdout + installed.stderr

    alone = in_venv(venv, cwd, "python", "-c", IMPORT_FAILS, "pgfence", "supervisor", "handlers")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines() == ["pgfence imported", "supervisor ModuleNotFoundError supervisor",
                                         "handlers ModuleNotFoundError handlers"]

    added = in_venv(venv, cwd, "pip", "install", "--quiet", "supervisor")
    assert added.returncode == 0, added.stdout + added.stderr
    both = in_venv(venv, cwd, "python", "-c",
                   "import pgfence, supervisor, supervisor.options, supervisor.supervisord\n"
                   "print(pgfence.__file__); print(supervisor.__file__); print(supervisor.options.__file__)")
    assert both.returncode == 0, both.stderr
    pgfence_file, supervisor_file, options_file = map(Path, both.stdout.split())
    [site_packages] = {p.parent.parent for p in (pgfence_file, supervisor_file)}
    assert site_packages.name == "site-packages" and site_packages.is_relative_to(venv), site_packages
    assert pgfence_file == site_packages / "pgfence" / "__init__.py"
    assert supervisor_file == site_packages / "supervisor" / "__init__.py"
    assert options_file == site_packages / "supervisor" / "options.py"
    listed = in_venv(venv, cwd, "pip", "show", "--files", "supervisor")
    assert "supervisor/options.py" in listed.stdout, listed.stdout

    # pgfence run, next to supervisord, completes a job and stops on TERM.
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    env = venv_env(venv)
    env["PGFENCE_DSN"] = dsn
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(venv / "bin" / "pgfence"), "run", "--workers", "1",
                                 "--handlers", "pgfence.handlers.builtin"],
                                cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done"
                 or proc.poll() is not None, timeout=60, message="the noop job done")
        assert proc.poll() is None, log.read_text()
        assert scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text()
    assert list(cwd.iterdir()) == []
