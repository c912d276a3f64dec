"""The public API reaches type checkers typed: a user module that misuses it
fails mypy at each planted mistake, and a correct one passes.

mypy reads pgfence through the view .ci/typecheck assembles (a ``pgfence/``
tree of links to ``supervisor/``, ``handlers/`` and ``sql/``), since it cannot
follow setuptools' editable finder.  No database is needed.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is not installed (it comes with the dev extra)")

REPO = Path(__file__).resolve().parent.parent

#: Each planted mistake carries ``# E: <mypy error code>`` on the line mypy
#: must report it at.
MISUSE = '''\
from typing import Any

import psycopg

from pgfence import Job, enqueue, handler


@handler("typo")
def typo(job: Job) -> None:
    job.chek()  # E: attr-defined


@handler("bad-lease", lease="thirty")  # E: arg-type
def bad_lease(job: Job) -> None:
    job.check()


@handler("not-a-job")  # E: type-var
def not_a_job(order_id: int) -> None:
    print(order_id)


def produce(conn: psycopg.Connection[Any]) -> None:
    enqueue(conn, 42, {"order_id": 1})  # E: arg-type
    enqueue(conn, "receipt", {"order_id": 1}, priority="high")  # E: arg-type
    enqueue(conn, "receipt", {1, 2})  # E: arg-type
    enqueue("postgresql://localhost/app", "receipt")  # E: arg-type


reveal_type(typo)  # N: Revealed type is "def (job: pgfence.job.Job)"
'''

CORRECT = '''\
from typing import Any

import psycopg

from pgfence import Job, LeaseLost, enqueue, handler
from pgfence.worker.lease import Lease


@handler("send_receipt", queue="mail", lease=60, timeout=300.5, max_attempts=5, max_reclaims=3)
def send_receipt(job: Job) -> None:
    order: dict[str, Any] = job.payload
    job.check()
    with job.fenced() as conn:
        conn.execute("INSERT INTO receipts (order_id, key) VALUES (%s, %s)", (order["id"], job.idempotency_key))


@handler("audit")
def audit(job: Job) -> bool:
    try:
        with job.fenced_writes() as writes:
            writes.execute("INSERT INTO audit (job_id) VALUES (%(id)s)", {"id": job.id})
    except LeaseLost as exc:
        print(exc)
        return False
    return job.completed


def produce(conn: psycopg.Connection[Any]) -> int:
    counts: dict[str, int] = {"a": 1}
    first = enqueue(conn, "send_receipt", {"id": 42, "lines": [1, 2.5, None, "x"]}, queue="mail")
    return first + enqueue(conn, "audit", counts, priority=-1, delay=2.5, dedupe_key="k")


send_receipt(Job(1, "send_receipt", "mail", 1, {"id": 42}, Lease(1, 1, 30.0)))
'''


def _mypy(tmp_path: Path, source: str) -> tuple[int, list[str]]:
    """Run ``mypy --strict`` on ``source`` as a user module; return its exit
    status and output lines."""
    view = tmp_path / "view"
    subprocess.run([sys.executable, str(REPO / ".ci" / "typecheck"), "--view", str(view)], check=True)
    user = tmp_path / "user"
    user.mkdir()
    (user / "usermod.py").write_text(source)
    # Errors inside pgfence itself are .ci/typecheck's to report; here only
    # the user module's count, so imports are followed silently.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--show-error-codes", "--hide-error-context", "--no-pretty", "--cache-dir", str(tmp_path / "cache"),
         "--config-file", str(REPO / "pyproject.toml"), "usermod.py"],
        cwd=user, capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(view)},
    )
    assert proc.stderr == ""
    return proc.returncode, proc.stdout.splitlines()


def _planted(source: str) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    """The (line, error code) of each ``# E:`` marker and the (line, note)
    of each ``# N:`` marker in ``source``."""
    errors, notes = set(), set()
    for number, line in enumerate(source.splitlines(), start=1):
        if (m := re.search(r"# E: (\S+)$", line)):
            errors.add((number, m.group(1)))
        if (m := re.search(r"# N: (.+)$", line)):
            notes.add((number, m.group(1)))
    return errors, notes


def test_mypy_reports_each_misuse_of_the_public_api_at_its_line(tmp_path: Path) -> None:
    status, lines = _mypy(tmp_path, MISUSE)
    expected_errors, expected_notes = _planted(MISUSE)
    errors, notes = set(), set()
    for line in lines:
        m = re.fullmatch(r"usermod\.py:(\d+): (error|note): (.*?)(?:  \[([a-z-]+)\])?", line)
        assert m, f"unexpected mypy output: {line!r}"
        number, severity, message, code = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if severity == "error":
            errors.add((number, code))
        else:
            notes.add((number, message))
    assert errors == expected_errors, "\n".join(lines)
    assert notes == expected_notes, "\n".join(lines)
    assert len(expected_errors) == 7
    assert status == 1
    # The messages name the mistake, not a generic failure.
    text = "\n".join(lines)
    assert '"Job" has no attribute "chek"' in text
    assert 'Argument "lease" to "handler" has incompatible type "str"; expected "float | None"' in text
    assert 'Argument 2 to "enqueue" has incompatible type "int"; expected "str"' in text


def test_a_correct_user_module_passes_mypy_strict(tmp_path: Path) -> None:
    status, lines = _mypy(tmp_path, CORRECT)
    assert lines == []
    assert status == 0


def test_every_exported_name_is_loaded_lazily_and_typed_eagerly() -> None:
    """__all__ (a literal list, so type checkers read it) names exactly the
    lazily loaded names plus __version__, each also imported under
    TYPE_CHECKING; importing pgfence and reading __version__ does not
    import prometheus_client."""
    import pgfence

    assert sorted(pgfence.__all__) == sorted([*pgfence._EXPORTS, "__version__"])
    init = (REPO / "supervisor" / "__init__.py").read_text()
    checked = init.split("if TYPE_CHECKING:", 1)[1].split("\n_EXPORTS", 1)[0]
    for name in pgfence._EXPORTS:
        assert re.search(rf"\b{name}\b", checked), f"{name} is not imported under TYPE_CHECKING"
    code = textwrap.dedent("""
        import sys
        import pgfence
        print(pgfence.__version__, "prometheus_client" in sys.modules)
        pgfence.Job
        print("prometheus_client" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [importlib.metadata.version("pgfence"), "False", "True"]
