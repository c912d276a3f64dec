"""The package's shape, read from its source with ``ast`` (nothing is
imported but in the last test): no import cycle, a strict layering, no module
over 400 lines, and a runtime that never imports the tools.

The graph: one node per module of ``supervisor/`` (the package ``pgfence``;
a package is its ``__init__``), one edge per ``import`` or ``from ...
import`` of another module of it, relative imports resolved, ``from P import
M`` counted as an import of the submodule ``P.M`` when there is one.  An
import inside a function counts as much as one at the top of a module (it
runs too, only later); an import under ``if TYPE_CHECKING:`` is counted
apart, as a *type-only* edge: it never runs, so it may close a cycle (none
does today), but it must still respect the layers.  Implicit imports of a
parent package (importing ``pgfence.web.app`` runs ``pgfence/web/__init__``)
are not edges.

The layers, bottom-up (a module belongs to the layer of the longest prefix
in :data:`LAYERS` that names it):

1. ``base``: what everything may use and which uses nothing above it: errors,
   names, identity, bounds, backoff, error text, the settings (their
   declaration, converters and table), a schedule's definition and plan, the
   metric definitions, and the leaf pieces of the prefork runtime that other
   layers share (the slot table in shared memory, process titles, systemd
   notify, the signals' inbox) and of the worker (its wake-up and event loop
   primitives);
2. ``store``: the SQL seam (``pgfence.store``);
3. ``job API``: what a handler module and a producer import: ``pgfence``
   itself, ``job``, ``asyncjob``, ``producer``, ``registry`` and the lease
   a job carries (``worker.lease``);
4. ``observe``: the metrics server, the vacuum watch, and the base of the
   renewal process's background services (``background``);
5. ``runtime``: the worker, the renewal process, the periodic scheduler;
6. ``prefork``: the arbiter and its children;
7. ``admin``: the operator's commands as data (shared by the CLI and the
   dashboard);
8. ``web``: the dashboard;
9. ``cli``: the command line;
10. ``contrib``: the integrations with frameworks (the Django tasks backend,
    whose management command runs the command line);
11. ``tools``: the demo, the load test, the mail sink.

The rule: no module imports a module of a higher layer.  One exception,
named in :data:`UPWARD`: the CLI's command that runs a tool imports it,
inside the command's function only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from pgtools import ROOT, env_for

PACKAGE = ROOT / "supervisor"
MAX_LINES = 400

#: Layers bottom-up: (name, module prefixes).  A prefix names a module and
#: its submodules; ``pgfence`` alone names only the package's ``__init__``.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("pgfence.errors", "pgfence.names", "pgfence.limits", "pgfence.identity", "pgfence.bounds",
              "pgfence.backoff",
              "pgfence.errortext", "pgfence.results", "pgfence.settings", "pgfence.settings_declare",
              "pgfence.settings_values",
              "pgfence.settings_table", "pgfence.scheduling.schedule", "pgfence.scheduling.plan",
              "pgfence.observe.metrics", "pgfence.observe.collect", "pgfence.observe.multiproc",
              "pgfence.prefork.slots", "pgfence.prefork.proctitle", "pgfence.prefork.sdnotify",
              "pgfence.prefork.signals", "pgfence.worker.wake", "pgfence.worker.aio")),
    ("store", ("pgfence.store",)),
    ("job API", ("pgfence", "pgfence.job", "pgfence.asyncjob", "pgfence.producer", "pgfence.client", "pgfence.registry",
                 "pgfence.worker.lease")),
    ("observe", ("pgfence.observe", "pgfence.background")),
    ("runtime", ("pgfence.worker", "pgfence.renewal", "pgfence.scheduling")),
    ("prefork", ("pgfence.prefork",)),
    ("admin", ("pgfence.admin",)),
    ("web", ("pgfence.web",)),
    ("cli", ("pgfence.cli", "pgfence.__main__")),
    ("contrib", ("pgfence.contrib",)),
    ("tools", ("pgfence.tools",)),
]

#: Imports allowed to go up a layer, inside a function only: (importer,
#: prefix of what it imports).
UPWARD = {("pgfence.cli.tools", "pgfence.tools")}

#: Modules allowed over the limit for now (none): each may not grow past the
#: size named, and its entry goes once it is within the limit.
OVER_LIMIT_ELSEWHERE: dict[str, int] = {}


class Edge(NamedTuple):
    source: str
    target: str
    line: int
    #: Inside a function (runs when the function is called).
    deferred: bool
    #: Under ``if TYPE_CHECKING:`` (never runs).
    type_only: bool


def module_names(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package's ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(["pgfence", *parts])] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, source: str, is_package: bool, modules: set[str]) -> list[Edge]:
    """Every import of another module of ``modules`` in ``source`` (the
    module ``name``)."""
    edges: list[Edge] = []

    def add(target: str, node: ast.stmt, deferred: bool, type_only: bool) -> None:
        if target in modules and target != name:
            edges.append(Edge(name, target, node.lineno, deferred, type_only))

    def visit(body: list[ast.stmt], deferred: bool, type_only: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node, deferred, type_only)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    add(sub if sub in modules else module, node, deferred, type_only)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, deferred, True)
                visit(node.orelse, deferred, type_only)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, True, type_only)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        visit([n for n in inner if isinstance(n, ast.stmt | ast.excepthandler)], deferred,
                              type_only)
            if isinstance(node, ast.ExceptHandler):
                visit(node.body, deferred, type_only)

    visit(ast.parse(source).body, False, False)
    return edges


def import_graph(package: Path = PACKAGE) -> list[Edge]:
    modules = module_names(package)
    return [edge for name, (path, is_package) in modules.items()
            for edge in imports_of(name, path.read_text(encoding="utf-8"), is_package, set(modules))]


def find_cycle(edges: list[Edge]) -> list[str] | None:
    """One import cycle as a path (``a -> b -> a``), or None."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge.target)
    state: dict[str, int] = {}   # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(set(graph.get(node, []))):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix if prefix == "pgfence" else \
                module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best:
                best, layer = len(prefix), index
    if layer < 0:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS")
    return layer


def layer_violations(edges: list[Edge]) -> list[str]:
    out = []
    for edge in edges:
        low, high = layer_of(edge.source), layer_of(edge.target)
        if high <= low:
            continue
        if edge.deferred and any(edge.source == who and (edge.target == what or edge.target.startswith(what + "."))
                                 for who, what in UPWARD):
            continue
        out.append(f"{edge.source}:{edge.line} ({LAYERS[low][0]}) imports {edge.target} ({LAYERS[high][0]})"
                   + (" under TYPE_CHECKING" if edge.type_only else ""))
    return out


def tools_imports_outside_tools(edges: list[Edge]) -> list[str]:
    """Imports of pgfence.tools by modules outside it, but the CLI's tools
    command's imports inside its functions."""
    return [f"{e.source}:{e.line} imports {e.target}" + (" (inside a function)" if e.deferred else "")
            for e in edges
            if e.target.startswith("pgfence.tools") and not e.source.startswith("pgfence.tools")
            and not (e.source == "pgfence.cli.tools" and e.deferred)]


# -- the package ----------------------------------------------------------------------


def test_the_graph_is_read_from_every_module():
    edges = import_graph()
    modules = module_names()
    assert len(modules) > 100 and {"pgfence.prefork.arbiter", "pgfence.cli.main", "pgfence.tools.demo"} <= set(modules)
    # A relative import is resolved like an absolute one.
    assert Edge("pgfence.web", "pgfence.web.app", 15, False, True) in edges
    assert any(e.source == "pgfence.cli.tools" and e.target == "pgfence.tools.demo" and e.deferred for e in edges)


def test_no_import_cycle():
    runtime = [e for e in import_graph() if not e.type_only]
    cycle = find_cycle(runtime)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_even_with_type_only_imports():
    # Type-only imports are allowed to close a cycle (they never run); none
    # does today, and this says so when one starts to.
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle (TYPE_CHECKING imports counted): " + " -> ".join(cycle or [])


def test_no_module_imports_from_a_higher_layer():
    assert layer_violations(import_graph()) == []


def test_no_module_is_over_400_lines():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in OVER_LIMIT_ELSEWHERE}
    assert over == {}, f"modules over {MAX_LINES} lines: split them by what they hold"
    for path, most in OVER_LIMIT_ELSEWHERE.items():
        assert sizes[path] <= most, f"{path} grew past {most} lines"
        assert sizes[path] > MAX_LINES, f"{path} is within {MAX_LINES} lines now: drop it from OVER_LIMIT_ELSEWHERE"


def test_only_the_cli_tools_command_imports_the_tools_and_only_when_it_runs():
    edges = import_graph()
    assert tools_imports_outside_tools(edges) == []
    # The one that may, may only inside its functions.
    assert not [e for e in edges if e.source == "pgfence.cli.tools" and e.target.startswith("pgfence.tools")
                and not e.deferred]


def test_a_worker_run_imports_nothing_of_the_tools(dsn):
    """A worker, run through the command line as users run it, then the
    other runtime entry points (the arbiter, the renewal process, the
    metrics server, the dashboard, the parser of ``pgfence run``): not one
    module of pgfence.tools in sys.modules."""
    script = """
import json, sys
from pgfence.cli.main import main
codes = [main(["enqueue", "noop", "--handlers", "pgfence.handlers.builtin"]),
         main(["work", "--burst", "--retention", "none", "--handlers", "pgfence.handlers.builtin"])]
import pgfence.observe.server, pgfence.prefork.arbiter, pgfence.renewal.process
from pgfence.cli.parser import build_parser
build_parser().parse_args(["run"])
try:
    import pgfence.web.app
except ImportError:   # the web extra is not installed
    pass
print(json.dumps({"codes": codes, "tools": sorted(m for m in sys.modules if m.startswith("pgfence.tools"))}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env_for(dsn), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["codes"] == [0, 0], done.stderr
    assert report["tools"] == []


# -- the checks catch what they look for ----------------------------------------------


def _planted(modules: dict[str, str]) -> list[Edge]:
    names = set(modules)
    return [e for name, source in modules.items() for e in imports_of(name, source, False, names)]


def test_the_checks_catch_planted_faults():
    planted = _planted({
        "pgfence.errors": "",
        "pgfence.store.db": "from pgfence.errors import X\nfrom pgfence.worker import engine\n",
        "pgfence.worker.engine": "from ..store import db\n",
        "pgfence.worker.claiming": "def f():\n    import pgfence.tools.demo\n",
        "pgfence.cli.run": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pgfence.tools import demo\n",
        "pgfence.cli.tools": "import pgfence.tools.demo\n",
        "pgfence.tools.demo": "",
    })
    # The cycle store.db -> worker.engine -> store.db (a relative import).
    assert find_cycle(planted) == ["pgfence.store.db", "pgfence.worker.engine", "pgfence.store.db"]
    assert layer_violations(planted) == [
        "pgfence.store.db:2 (store) imports pgfence.worker.engine (runtime)",
        "pgfence.worker.claiming:2 (runtime) imports pgfence.tools.demo (tools)",
        "pgfence.cli.run:3 (cli) imports pgfence.tools.demo (tools) under TYPE_CHECKING",
        "pgfence.cli.tools:1 (cli) imports pgfence.tools.demo (tools)",
    ]
    assert tools_imports_outside_tools(planted) == [
        "pgfence.worker.claiming:2 imports pgfence.tools.demo (inside a function)",
        "pgfence.cli.run:3 imports pgfence.tools.demo",
        "pgfence.cli.tools:1 imports pgfence.tools.demo",
    ]
    # A type-only edge is marked as one.
    assert [e.type_only for e in planted if e.source == "pgfence.cli.run"] == [True]
