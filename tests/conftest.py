"""Shared fixtures: a fresh PostgreSQL database per test, on a real server.

Every test that takes ``dsn`` runs against each backend in
``PGFENCE_TEST_BACKENDS`` (default ``server,embedded``):

- ``server``: the PostgreSQL at ``PGFENCE_TEST_DSN``
  (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
- ``embedded``: pgfence's embedded PostgreSQL 18, started once per session
  in a temporary folder and stopped at the end.

When both backends run, the modules in ``SERVER_ONLY_WHEN_BOTH`` and the
tests marked ``server_only`` (they drive processes, signals, timing or the
command line's parsing, which do not depend on the server's version) run on
the server alone, so the default command stays near ten
minutes on two cores; everything that speaks version-dependent SQL (claims,
the fence, migrations, enqueue, kinds, plans) runs on both.
``PGFENCE_TEST_EMBEDDED=all`` runs every test on both backends.

A migrated template database, with the example handlers' tables, is made
once per backend; each test gets its
own copy (``CREATE DATABASE ... TEMPLATE``) and it is dropped afterwards.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pgtools import admin_connect, with_dbname  # noqa: E402
from pgfence import registry as _registry  # noqa: E402

# The example handlers are registered once for the whole session, so that the
# per-test registry reset below keeps them (a module is imported only once).
_registry.load(["pgfence.handlers.builtin", "pgfence.handlers.receipts"])

BACKENDS = [b.strip() for b in os.environ.get("PGFENCE_TEST_BACKENDS", "server,embedded").split(",") if b.strip()]
#: Modules whose tests run on the server alone when both backends are
#: configured (see the module's docstring).
SERVER_ONLY_WHEN_BOTH = frozenset({
    "test_supervisor_faults", "test_supervisor", "test_demo", "test_heartbeat", "test_idle_wait",
    "test_prometheus_scrape", "test_metrics", "test_unknown_kinds", "test_timeout_start", "test_poison",
    "test_outages", "test_orphans", "test_concurrency", "test_operations", "test_periodic_run", "test_web_browser",
    "test_fault_matrix", "test_results",
})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "server_only: with both backends, run on the server alone (the test drives processes or "
        "the command line, not version-dependent SQL), as the modules in SERVER_ONLY_WHEN_BOTH")


def _server_only(item: pytest.Item) -> bool:
    return item.module.__name__ in SERVER_ONLY_WHEN_BOTH or item.get_closest_marker("server_only") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if len(BACKENDS) < 2 or os.environ.get("PGFENCE_TEST_EMBEDDED") == "all":
        return
    dropped = [item for item in items
               if getattr(item, "callspec", None) is not None
               and item.callspec.params.get("backend") == "embedded"
               and _server_only(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        chosen = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in chosen]


SERVER_DSN = os.environ.get("PGFENCE_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def embedded_admin_dsn():
    import shutil
    import tempfile

    from pgfence.store import embedded

    # Not under pytest's basetemp: concurrent pytest runs prune each other's
    # old basetemps, and a live server's data must not go with them.
    home = Path(tempfile.mkdtemp(prefix="pgfence-embedded-"))
    pgdata = home / "pgdata"
    dsn = embedded.start(pgdata)
    yield dsn
    embedded.stop(pgdata)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    """(name, admin DSN, template database name) for one backend."""
    name = request.param
    if name == "server":
        admin_dsn = SERVER_DSN
    elif name == "embedded":
        admin_dsn = request.getfixturevalue("embedded_admin_dsn")
    else:
        raise pytest.UsageError(f"unknown backend {name!r} in PGFENCE_TEST_BACKENDS")
    template = f"pgfence_tmpl_{uuid.uuid4().hex[:10]}"
    with admin_connect(admin_dsn) as conn:
        conn.execute(f'CREATE DATABASE "{template}"')
    try:
        from pgfence.handlers.tables import create_tables
        from pgfence.store import migrate

        with psycopg.connect(with_dbname(admin_dsn, template), autocommit=True) as conn:
            migrate.apply(conn)
            # The example handlers' tables (the effect and send_receipt kinds
            # write there), which pgfence's migrations do not create.
            create_tables(conn)
        yield name, admin_dsn, template
    finally:
        with admin_connect(admin_dsn) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')


@pytest.fixture
def dsn(backend):
    """A DSN to a fresh, migrated database of its own, dropped after the test."""
    _name, admin_dsn, template = backend
    name = f"pgfence_t_{uuid.uuid4().hex[:12]}"
    with admin_connect(admin_dsn) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with admin_connect(admin_dsn) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_dsn(backend):
    """A DSN to a fresh database WITHOUT the pgfence schema."""
    _name, admin_dsn, _template = backend
    name = f"pgfence_e_{uuid.uuid4().hex[:12]}"
    with admin_connect(admin_dsn) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with admin_connect(admin_dsn) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(dsn):
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture(autouse=True)
def _clean_registry():
    """Handlers registered by one test do not leak into the next."""
    from pgfence import registry

    before = dict(registry._REGISTRY)
    schedules = dict(registry._SCHEDULES)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    registry._SCHEDULES.clear()
    registry._SCHEDULES.update(schedules)


@pytest.fixture
def make_worker(dsn):
    """Make in-process Workers on the test's database; closed afterwards."""
    from pgfence.settings import Settings
    from pgfence.worker.engine import Worker

    made: list[Worker] = []

    def make(name: str = "w1", **options) -> Worker:
        worker = Worker(dsn, Settings(**options), name=name)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


@pytest.fixture
def runs():
    """Start `pgfence run` subprocesses with a metrics endpoint of their own
    (metricstools.Run), ready when /readyz says so; all stopped afterwards."""
    from metricstools import Run, http_get
    from pgtools import wait_for

    made = []

    def start(dsn: str, *args: str, **kw):
        run = Run(dsn, *args, **kw)
        made.append(run)
        wait_for(lambda: http_get(run.url("/readyz"))[0] == 200, timeout=30, message="/readyz 200")
        return run

    yield start
    for run in made:
        run.stop()
