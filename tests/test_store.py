"""The store layer is the one seam for SQL: only ``supervisor/store/`` (and,
for the tools' own statements, the tools' statement modules beside their
``.sql`` files) reads query results by position, every named query has a
store function, and the owner writes follow one policy whoever issues them.

The first two tests read source code, without a database; the last ones run
against the test's database."""

from __future__ import annotations

import ast
from pathlib import Path

import psycopg

import pgfence.handlers.builtin  # noqa: F401 - registers noop, sleep, fail before the registry snapshot
from pgtools import job_row, scalar
from pgfence import enqueue
from pgfence.backoff import Backoff
from pgfence.store.queries import all_queries

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "supervisor"
STORE = PACKAGE / "store"
#: The tools' own statements: each loads the ``.sql`` file beside it
#: through ``queries_in``, the store's loader.
TOOL_STATEMENTS = {PACKAGE / "tools" / "demo" / "store.py": PACKAGE / "tools" / "demo" / "demo.sql",
                   PACKAGE / "tools" / "loadtest" / "statements.py": PACKAGE / "tools" / "loadtest" / "loadtest.sql"}

#: Cursor methods that return one row, and those whose result is rows.
ONE_ROW = {"fetchone"}
MANY_ROWS = {"fetchall", "fetchmany", "execute", "executemany"}


class PositionalReads(ast.NodeVisitor):
    """Finds query results read by position in one module: a row indexed
    (``row[0]``, ``...fetchone()[0]``) or unpacked (``a, b = row``,
    ``for a, b in conn.execute(...)``).

    A result is followed through plain names within one function: a name
    bound to ``fetchone()`` is a row; one bound to ``fetchall()`` or to an
    ``execute()`` cursor holds rows, and so does ``db.retrying(lambda:
    ...)`` around such a call; iterating over rows, or indexing them, gives
    a row.  Any other indexing or unpacking (a list, a dict item, a slot
    table's tuple) is not a query result and is left alone."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.found: list[str] = []
        self.scopes: list[dict[str, str]] = [{}]

    # -- what an expression is ----------------------------------------------

    def kind(self, node: ast.AST | None) -> str | None:
        """"row", "rows" or None (not a query result)."""
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ONE_ROW:
                return "row"
            if name in MANY_ROWS and isinstance(func, ast.Attribute):
                return "rows"
            if name == "retrying" and node.args and isinstance(node.args[0], ast.Lambda):
                return self.kind(node.args[0].body)
            return None
        if isinstance(node, ast.Name):
            return self.scopes[-1].get(node.id)
        if isinstance(node, ast.Subscript) and self.kind(node.value) == "rows":
            return "row"
        return None

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.filename}:{getattr(node, 'lineno', '?')}: {what}")

    def bind(self, target: ast.AST, kind: str | None, node: ast.AST) -> None:
        """``target`` takes a value of ``kind``: a tuple target unpacks a
        query result by position; a name remembers what it holds."""
        if isinstance(target, ast.Tuple | ast.List):
            if kind is not None:
                self.flag(node, f"a query's {kind} unpacked by position")
            for element in target.elts:
                self.bind(element, None, node)
        elif isinstance(target, ast.Name):
            if kind is None:
                self.scopes[-1].pop(target.id, None)
            else:
                self.scopes[-1][target.id] = kind

    # -- the nodes ------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.bind(target, self.kind(node.value), node)
            if not isinstance(target, ast.Name | ast.Tuple | ast.List):
                self.visit(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self.bind(node.target, self.kind(node.value), node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.bind(node.target, self.kind(node.value), node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.bind(node.target, "row" if self.kind(node.iter) == "rows" else None, node)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, None, node)
        for statement in node.body:
            self.visit(statement)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        # The generators bind the names the element reads: visit them first.
        for generator in node.generators:
            self.visit(generator.iter)
            self.bind(generator.target, "row" if self.kind(generator.iter) == "rows" else None, node)
            for condition in generator.ifs:
                self.visit(condition)
        if isinstance(node, ast.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_Call(self, node: ast.Call) -> None:
        # rows.sort(key=lambda r: ...) and sorted(rows, key=lambda r: ...):
        # the lambda's argument is a row.
        func = node.func
        sorts = ((isinstance(func, ast.Attribute) and func.attr == "sort" and self.kind(func.value) == "rows")
                 or (isinstance(func, ast.Name) and func.id == "sorted" and bool(node.args)
                     and self.kind(node.args[0]) == "rows"))
        key = next((k.value for k in node.keywords if k.arg == "key"), None)
        if not sorts or not isinstance(key, ast.Lambda) or not key.args.args:
            self.generic_visit(node)
            return
        self.visit(func)
        for arg in node.args:
            self.visit(arg)
        self.scopes.append({**self.scopes[-1], key.args.args[0].arg: "row"})
        self.visit(key.body)
        self.scopes.pop()

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.kind(node.value) == "row":
            self.flag(node, "a query's row indexed by position")
        self.generic_visit(node)


def positional_reads(source: str, filename: str = "<planted>") -> list[str]:
    checker = PositionalReads(filename)
    checker.visit(ast.parse(source, filename))
    return checker.found


def package_modules_outside_the_store() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if STORE not in p.parents and p not in TOOL_STATEMENTS)


def test_no_module_outside_the_store_reads_a_row_by_position() -> None:
    modules = package_modules_outside_the_store()
    assert len(modules) > 40 and PACKAGE / "worker" / "engine.py" in modules
    found = [hit for path in modules
             for hit in positional_reads(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_positional_read_check_catches_planted_reads_and_only_those() -> None:
    planted = '''
def claim(self):
    rows = self.conn.execute(q("claim"), params).fetchall()
    rows.sort(key=lambda r: (-r[9], r[0]))
    for row in rows:
        (job_id, queue) = row
    first = rows[0][0]
    n = conn.execute(q("loadtest_deadlocks")).fetchone()[0]
    row = db.retrying(lambda: self.conn.execute(q("release"), params).fetchone(), dsn)
    status = row[0]
    ids = {r[0] for r in conn.execute(q("complete_many"), params)}
    for queue, state, jobs in conn.execute(q("status_counts")):
        pass
    counts = {status: n for status, n in conn.execute(q("loadtest_states"), p).fetchall()}
    if (found := cur.fetchone()) and found[1]:
        pass
'''
    assert [hit.split(": ", 1)[1] for hit in positional_reads(planted)] == [
        "a query's row indexed by position",       # r[9] in the sort key
        "a query's row indexed by position",       # r[0] in the sort key
        "a query's row unpacked by position",      # (job_id, queue) = row
        "a query's row indexed by position",       # rows[0][0]
        "a query's row indexed by position",       # fetchone()[0]
        "a query's row indexed by position",       # row[0] after retrying
        "a query's row indexed by position",       # r[0] in a set comprehension
        "a query's row unpacked by position",      # for queue, state, jobs in ...
        "a query's row unpacked by position",      # {status: n for status, n in ...}
        "a query's row indexed by position",       # found[1]
    ]
    unrelated = '''
import sys
def other(self, conn, items, text):
    state = self.table.slot(s)[0]
    port = int(sys.argv[1])
    for key, value in items.items():
        pass
    head = text.split(":", 1)[0]
    _state, pid, number, _tick = self.table.slot(slot)
    row = conn.execute(q("claim"), params).fetchone()
    row = Claimed._make(row)
    cur = writes.execute(q("insert_effect"), params)
    rows = [Claimed._make(r) for r in conn.execute(q("claim"), params)]
    first = rows[0].id
    rows.sort(key=lambda r: (-r.priority, r.id))
    ordered = sorted(items, key=lambda kv: kv[1])
    return row.id, first, ordered
'''
    # The last "row" was rebound to something that is not a row; "rows"
    # holds NamedTuples built by a comprehension, not the cursor's rows.
    assert positional_reads(unrelated) == []


def _named_query_uses(paths: list[Path]) -> set[str]:
    """Every string literal of ``paths`` that names a query: a store
    function names its query as ``q("name")`` or passes the name on."""
    names = set(all_queries())
    used = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                used.add(node.value)
    return used


def test_every_named_query_is_issued_by_the_store_layer() -> None:
    names = set(all_queries())
    store = _named_query_uses(sorted(STORE.glob("*.py")))
    # The bundled handlers use only the public API: their statements are
    # their own text, never a named query of the product.
    handlers = _named_query_uses(sorted((ROOT / "handlers").glob("*.py")))
    assert handlers == set()
    assert names - store == set()
    # And no module of the package outside the store loads a query itself.
    loads = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in package_modules_outside_the_store()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "q"]
    assert loads == []


def test_every_named_query_of_the_tools_is_issued_beside_it() -> None:
    from pgfence.store.queries import parse

    for module, sql in TOOL_STATEMENTS.items():
        names = set(parse(sql.read_text(encoding="utf-8")))
        used = {node.value for node in ast.walk(ast.parse(module.read_text(encoding="utf-8")))
                if isinstance(node, ast.Constant) and node.value in names}
        assert names and names - used == set(), module
        # None of them is a product query, nor shadows one.
        assert names.isdisjoint(all_queries()), module


# -- one policy for every owner write ------------------------------------------------


def retry_window(conn: psycopg.Connection, job_id: int) -> float:
    """Seconds from now until the job's run_at, by the database clock."""
    return scalar(conn, "SELECT extract(epoch FROM run_at - clock_timestamp())::float8 FROM pgfence.all_jobs "
                        "WHERE id = %s", (job_id,))


def test_a_timed_out_attempt_reported_by_the_heartbeat_retries_after_the_workers_backoff(conn, make_worker):
    """A worker killed past its timeout has its attempt reported by the
    heartbeat manager; the retry waits the same exponential backoff with
    jitter as a failure the worker reports itself (backoff_base 4: attempt 1
    waits 2 to 4 s, attempt 2 waits 4 to 8 s), not a fixed second."""
    job_id = enqueue(conn, "sleep", {"seconds": 60}, max_attempts=5)
    worker = make_worker("w-timeout", backoff_base=4.0, backoff_max=300.0)
    assert worker.heartbeat is not None
    error = "timed out after 1s; worker killed"
    for attempt, (low, high) in [(1, (2.0, 4.0)), (2, (4.0, 8.0))]:
        conn.execute("UPDATE pgfence.jobs SET run_at = now() WHERE id = %s", (job_id,))
        [job] = worker.claim()
        assert (job.id, job.attempt) == (job_id, attempt)
        worker.heartbeat.untrack(job.lease)
        assert worker.heartbeat.release([(job.id, job.attempt, False, error)]) == 1
        window = retry_window(conn, job_id)
        # Measured just after the report: a few milliseconds off its top.
        assert low - 0.5 <= window <= high, (attempt, window)
        row = job_row(conn, job_id)
        assert (row["status"], row["attempt"], row["last_error"], row["locked_by"]) == (
            "queued", attempt, error, None)


def test_a_stale_report_from_the_heartbeat_changes_nothing(conn, make_worker):
    """The heartbeat's report goes through the same fenced write: an
    attempt that no longer owns the job writes nothing and counts nothing."""
    job_id = enqueue(conn, "sleep", {"seconds": 60}, max_attempts=5)
    worker = make_worker("w-stale", backoff_base=4.0)
    assert worker.heartbeat is not None
    [job] = worker.claim()
    worker.heartbeat.untrack(job.lease)
    before = job_row(conn, job_id)
    assert worker.heartbeat.release([(job.id, job.attempt + 1, False, "timed out"),
                                     (job.id, job.attempt - 1, True, None)]) == 0
    assert job_row(conn, job_id) == before
    assert worker.release(job) is True


def test_backoff_policy_object_is_what_both_callers_use() -> None:
    # The default manager policy is the Settings default, so a manager built
    # without settings (a test, the benchmark) does not drift either.
    from pgfence.renewal.renewer import HeartbeatManager
    from pgfence.settings import Settings

    defaults = Settings()
    manager = HeartbeatManager("postgresql://unused@127.0.0.1:1/x")
    try:
        assert manager.backoff == Backoff(defaults.backoff_base, defaults.backoff_max)
    finally:
        manager.stop()
