"""Helpers for tests of the metrics endpoint: free ports, scraping, parsing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pgtools import env_for, scalar, spawn, wait_for
from pgfence import enqueue


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(parsed: dict, name: str, **labels: str) -> float:
    """Sum of every sample called ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in parsed.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))


HANDLERS = "pgfence.handlers.builtin,fault_handlers"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def worker_pids(arbiter: int) -> list[int]:
    return [p for p in children(arbiter) if title(p).startswith("pgfence worker ")]


class Run:
    """A `pgfence run` subprocess with its metrics port."""

    def __init__(self, dsn: str, *args: str, env_extra: dict | None = None):
        self.port = free_port()
        self.metrics_dir = None
        env = env_for(dsn, **(env_extra or {}))
        self.proc = spawn("run", "--metrics-port", str(self.port), "--handlers", HANDLERS, *args,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.seen: set[int] = set()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def scrape(self) -> dict:
        status, text = http_get(self.url("/metrics"))
        assert status == 200, status
        return samples(text)

    def try_scrape(self) -> dict:
        """The parsed metrics, or {} when a scrape fails (for polling)."""
        status, text = http_get(self.url("/metrics"))
        return samples(text) if status == 200 else {}

    def descendants(self) -> list[int]:
        kids = children(self.proc.pid)
        self.seen |= set(kids)
        return kids

    def stop(self) -> str:
        kids = self.descendants()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, err = self.proc.communicate()
        for pid in self.seen:
            try:
                if title(pid).startswith("pgfence"):
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return err


def holder_pid(conn, job_id: int) -> int:
    locked_by = scalar(conn, "SELECT locked_by FROM pgfence.all_jobs WHERE id = %s", (job_id,))
    return int(locked_by.split(":")[1])


def reclaim_and_reject(conn) -> int:
    """One reclaim and one fenced rejection on a running `pgfence run` with a
    short lease and two workers: the holder of a `stubborn` job is frozen in
    its fenced transaction past its lease, the other worker reclaims, the
    frozen one wakes and its commit is refused.  Returns the job id."""
    job_id = enqueue(conn, "stubborn", {"seconds": 2.5})
    wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "running")
    first = holder_pid(conn, job_id)
    # Freeze the holder inside its fenced transaction, after its write.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND application_name = %s "
                                  "AND state = 'idle in transaction'",
                            (f"pgfence worker {scalar(conn, 'SELECT locked_by FROM pgfence.all_jobs WHERE id = %s', (job_id,))}",)) == 1,
             message="the holder inside its fenced transaction")
    os.kill(first, signal.SIGSTOP)
    # No renewal for a stopped child: the other one reclaims as attempt 2.
    wait_for(lambda: scalar(conn, "SELECT attempt FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == 2, timeout=15)
    os.kill(first, signal.SIGCONT)
    wait_for(lambda: scalar(conn, "SELECT status FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == "done", timeout=15)
    # The late commit is rolled back: once the frozen child is idle again its
    # transaction is gone, and one effect row remains, attempt 2's.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                  "state = 'idle in transaction' "
                                  "AND application_name LIKE 'pgfence worker %%'") == 0, timeout=15)
    return job_id
