"""How the documentation's examples run (tests/test_docs_examples.py): the
databases, folders and background commands a chain of examples shares, and
the run of one block.  The annotations are read by tests/docexamples.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from docexamples import ROOT, Example, console_commands, output_matches, shell_lines
from pgtools import admin_connect, with_dbname

BIN = Path(sys.executable).parent
#: How long one block, and the wait for a background command, may take.
BLOCK_TIMEOUT = 60
READY_TIMEOUT = 30


class Databases:
    """Fresh databases for the chains, made ahead of need and dropped
    behind on a thread of their own, so that creating and dropping them
    (about a second each, on a server that fsyncs) overlaps with the
    examples that run meanwhile."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.template = f"pgfence_doctmpl_{uuid.uuid4().hex[:10]}"
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="doc-databases")
        self._made: dict[str, Future[str]] = {}
        self._dropped: list[Future[None]] = []
        self._thread.submit(self._make_template).result()

    def _execute(self, statement: sql.Composable) -> None:
        with admin_connect(self.admin_dsn) as conn:
            conn.execute(statement)

    def _make_template(self) -> None:
        from pgfence.handlers.tables import create_tables
        from pgfence.store import migrate

        self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        with psycopg.connect(with_dbname(self.admin_dsn, self.template), autocommit=True) as conn:
            migrate.apply(conn)        # the example handlers' tables too, as the suite's template has
            create_tables(conn)

    def _create(self, empty: bool) -> str:
        name = f"pgfence_doc_{uuid.uuid4().hex[:12]}"
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if not empty:
            create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(self.template))
        self._execute(create)
        return name

    def prepare(self, key: str, empty: bool) -> None:
        """Start making the database ``key`` will ask for."""
        if key not in self._made:
            self._made[key] = self._thread.submit(self._create, empty)

    def get(self, key: str, empty: bool) -> str:
        """The DSN of the database made for ``key`` (made now if it was not prepared)."""
        self.prepare(key, empty)
        return with_dbname(self.admin_dsn, self._made[key].result())

    def release(self, key: str) -> None:
        """Drop the database made for ``key``, once made."""
        made = self._made.pop(key, None)
        if made is not None:
            self._dropped.append(self._thread.submit(self._drop_made, made))

    def _drop_made(self, made: Future[str]) -> None:
        if made.exception() is None:
            self._execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(made.result())))

    def fresh(self, empty: bool) -> str:
        return with_dbname(self.admin_dsn, self._thread.submit(self._create, empty).result())

    def drop(self, dsn: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        self._dropped.append(self._thread.submit(self._execute, statement))

    def close(self) -> None:
        for key in list(self._made):
            self.release(key)
        self.drop(with_dbname(self.admin_dsn, self.template))
        self._thread.shutdown(wait=True)
        for dropped in self._dropped:
            dropped.result()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _true(dsn: str, query: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query.encode()).fetchone()
    return bool(row and row[0])


class Background:
    """A long-running command of an example, and its output file."""

    def __init__(self, example: Example, command: str, cwd: Path, env: dict[str, str], log: Path,
                 ready: tuple[str, str]) -> None:
        self.example, self.log, self.dsn, self.ready = example, log, env["PGFENCE_DSN"], ready
        with log.open("wb") as out:
            # exec, so that the TERM reaches the command itself; env, so that
            # a command may start with VAR=value.
            self.proc = subprocess.Popen(["bash", "-c", "exec env " + command], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        kind, what = self.ready
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.example.id}: exited {self.proc.returncode} before it was ready:\n{self.output()}")
            if ((kind == "text" and what in self.output()) or (kind == "get" and _answers(what))
                    or (kind == "sql" and _true(self.dsn, what))):
                return
            time.sleep(0.05)
        pytest.fail(f"{self.example.id}: not ready within {READY_TIMEOUT}s ({kind} {what!r}):\n{self.output()}")

    def stop(self) -> int | None:
        """TERM, then wait for the exit; KILL (and None) if it does not come."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return None
        return self.proc.returncode


class Chain:
    """What a chain of examples shares: a folder, a database, the commands
    it left running, and the ids of the blocks it ran."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.root = Path(tempfile.mkdtemp(prefix="pgfence-doc-"))
        self.folder = self.root / "work"
        self.folder.mkdir()
        self.ran: list[str] = []
        self.background: list[Background] = []
        self.ports: dict[int, int] = {}

    def localize(self, example: Example, text: str) -> str:
        """``text`` with the documented ports the chain runs elsewhere replaced."""
        for port in example.free_ports:
            if port not in self.ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    self.ports[port] = s.getsockname()[1]
        for port, free in self.ports.items():
            text = re.sub(rf"(?<!\d){port}(?!\d)", str(free), text)
        return text

    def env(self, example: Example) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PGFENCE_") and k not in ("DATABASE_URL", "PYTHONPATH")}
        env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PGFENCE_DSN=self.dsn, PGFENCE_METRICS_PORT="0",
                   PGFENCE_HOME=str(self.root / "home"), PYTHONPATH=str(self.folder), PYTHONUNBUFFERED="1")
        env.update({name: self.localize(example, value) for name, value in example.env.items()})
        return env

    def stop(self) -> None:
        """Stop the chain's background commands; each must end with the
        status its example expects (0 unless it says otherwise)."""
        stopped = [(bg, bg.stop()) for bg in self.background]
        self.background = []
        for bg, status in stopped:
            assert status == bg.example.exit, \
                f"{bg.example.id}: exit status {status} after SIGTERM, not {bg.example.exit}:\n{bg.output()}"

    def close(self) -> None:
        for bg in self.background:
            bg.stop()
        self.background = []
        shutil.rmtree(self.root, ignore_errors=True)


def _check_output(example: Example, status: int, output: str, expected: list[str] | None = None) -> None:
    assert status == example.exit, f"{example.id}: exit status {status}, not {example.exit}:\n{output}"
    for text in example.expect:
        assert text in output, f"{example.id}: {text!r} not in its output:\n{output}"
    if expected:
        missing = output_matches(expected, output)
        assert missing is None, f"{example.id}: the output shown has {missing!r}, not in the output:\n{output}"


def _check_not_run(example: Example) -> None:
    """What can be checked without running: each ``pgfence`` command line
    is one that pgfence's parser takes, and each repository file it names
    exists."""
    from pgfence.cli.parser import build_parser

    if example.language not in ("bash", "sh", "console"):
        return
    code = console_commands(example.code)[0] if example.language == "console" else example.code
    for line in shell_lines(code):
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            for word in words:
                if "/" in word and word.split("/")[0] in ("deploy", "bench", "grafana", ".ci"):
                    assert (ROOT / word).exists(), f"{example.id}: {word} is not in the repository"
            if words and Path(words[0]).name == "pgfence":
                build_parser().parse_args(words[1:])


def _run_sql(dsn: str, code: str) -> str:
    """Run ``code`` (one or more statements); its notices and the rows of
    its last statement, as text."""
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        cur = conn.execute(code.encode())
        rows = cur.fetchall() if cur.description else []
    return "\n".join(notices + [" | ".join(map(str, row)) for row in rows])


def run(example: Example, chain: Chain) -> None:
    """Run one block in its chain; record it as run."""
    for program in example.needs:
        if shutil.which(program) is None:
            pytest.skip(f"{example.id} needs {program}, which is not installed here (.ci/run installs it)")
    if example.not_run:
        _check_not_run(example)
        chain.ran.append(example.id)
        return
    code = chain.localize(example, example.runnable_code())
    if example.file:
        path = chain.folder / example.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code, encoding="utf-8")
        if path.suffix == ".py":
            compile(code, str(path), "exec")
    elif example.language == "sql":
        _check_output(example, 0, _run_sql(chain.dsn, code))
    elif example.background:
        [command] = shell_lines(code)
        kind, what = example.background
        bg = Background(example, command, chain.folder, chain.env(example), chain.root / f"bg-{example.line}.log",
                        (kind, chain.localize(example, what)))
        chain.background.append(bg)
        bg.wait_ready()
    else:
        expected: list[str] = []
        if example.language == "python":
            script = chain.root / f"example-{example.line}.py"
            script.write_text(code, encoding="utf-8")
            argv = [sys.executable, str(script)]
        else:
            if example.language == "console":
                code, expected = console_commands(code)
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        done = subprocess.run(argv, cwd=ROOT if example.in_repository else chain.folder, env=chain.env(example),
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        _check_output(example, done.returncode, done.stdout + done.stderr, expected)
    chain.ran.append(example.id)
