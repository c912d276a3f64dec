"""Helpers for tests: DSN editing, polling with a deadline, running pgfence
as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def admin_connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02,
             message: str = "condition") -> Any:
    """Poll ``condition`` until it returns a truthy value; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value {value!r})")
        time.sleep(interval)


def env_for(dsn: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGFENCE_") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    if dsn:
        env["PGFENCE_DSN"] = dsn
    # Runs in tests serve no metrics endpoint unless they ask for one, so that
    # many can run at once without fighting over port 9464.
    env["PGFENCE_METRICS_PORT"] = "0"
    # pgfence loads no handler module by default; the tests' workers and
    # producers load the utility kinds (noop, sleep, fail, effect) unless a
    # test names other modules (a flag wins over this) or removes it.
    env["PGFENCE_HANDLERS"] = "pgfence.handlers.builtin"
    env.update(extra)
    return env


def pgfence(*args: str, dsn: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m pgfence ARGS`` to completion."""
    return subprocess.run([sys.executable, "-m", "pgfence", *args], cwd=ROOT,
                          env=env or env_for(dsn), capture_output=True, text=True, timeout=timeout, input=input)


def spawn(*args: str, dsn: str | None = None, env: dict[str, str] | None = None,
          **popen: Any) -> subprocess.Popen:
    """Start ``python -m pgfence ARGS`` in the background."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "pgfence", *args], cwd=ROOT,
                            env=env or env_for(dsn), text=True, **popen)


def title(pid: int) -> str | None:
    """The process title of ``pid`` (its cmdline), or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (R, S, T, Z...), or None if it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def started(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks after boot): with the pid, it
    names one process, even once the pid is reused."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def job_row(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgfence.all_jobs WHERE id = %s", (job_id,))
    names = [c.name for c in cur.description]
    row = cur.fetchone()
    return dict(zip(names, row)) if row else {}


def scalar(conn: psycopg.Connection, sql: str, params: Any = None) -> Any:
    return conn.execute(sql, params).fetchone()[0]


def finish(conn: psycopg.Connection, job_id: int, status: str = "done") -> int:
    """Finish a live job as pgfence's own statements do: move it from
    pgfence.jobs to pgfence.job_history with ``status``; its id."""
    return scalar(conn, """
        WITH moved AS (DELETE FROM pgfence.jobs WHERE id = %(id)s RETURNING *)
        INSERT INTO pgfence.job_history
               (id, created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims, priority,
                putbacks, status, queue, kind, dedupe_key, payload, last_error, last_traceback, worker)
        SELECT id, created_at, run_at, started_at, attempt, max_attempts, reclaims, max_reclaims, priority,
               putbacks, %(status)s, queue, kind, dedupe_key, payload, last_error, last_traceback, locked_by
          FROM moved
        RETURNING id""", {"id": job_id, "status": status})
