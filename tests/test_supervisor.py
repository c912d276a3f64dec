"""``pgfence run``, the prefork supervisor, as real processes.

Every test starts real ``pgfence run`` arbiters (``python -m pgfence
run``) against a real PostgreSQL, sends them real signals and looks at them
from the outside: the database, ``/proc`` (titles, threads, sockets) and the
log.  Every process a test starts is killed in the fixture's teardown, and
the tests that stop an arbiter check that none of its children is left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from metricstools import free_port, http_get
from pgtools import env_for, job_row, pgfence, scalar, spawn, wait_for
from pgfence.prefork.arbiter import MAX_BOOT_FAILURES
from pgfence.prefork.helper import METRICS_UP_AFTER, boot_backoff

#: The lease of the arbiters' workers; the heartbeat runs every third of it.
LEASE = 1.5
INTERVAL = LEASE / 3

FINAL = re.compile(r"arbiter stopped: (\d+) workers started, (\d+) restarts, "
                   r"heartbeat (\d+) rounds / (\d+) renewal statements")
STARTED = re.compile(r"(?:worker \d+|heartbeat manager) started \(pid (\d+)\)")


# -- looking at processes ------------------------------------------------------


def cmdline(pid: int) -> bytes:
    """The raw /proc/PID/cmdline (b"" once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def title(pid: int) -> str:
    """The process title: what ``ps`` shows (its first argv word)."""
    return cmdline(pid).split(b"\0", 1)[0].decode(errors="replace")


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads: line for pid {pid}")


def sockets(pid: int) -> list[str]:
    """The open file descriptors of ``pid`` that are sockets (TCP or Unix)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            out.append(f"{fd} -> {target}")
    return out


def running(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ours(pid: int) -> bool:
    """``pid`` runs and is a pgfence process: titled, or not yet (or never)
    retitled (``python -m pgfence ...``); a reused pid is not ours."""
    raw = cmdline(pid)
    return running(pid) and (raw.startswith(b"pgfence ") or b"\0-m\0pgfence\0" in raw)


def final_stats(log: str) -> tuple[int, int, int, int]:
    """(workers started, restarts, heartbeat rounds, renewal statements)."""
    found = FINAL.findall(log)
    assert len(found) == 1, log
    return tuple(int(n) for n in found[0])


def problems(log: str) -> list[str]:
    return [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line or "Traceback" in line]


class Run:
    """One ``pgfence run`` arbiter; its log (stdout and stderr) in a file."""

    def __init__(self, proc: subprocess.Popen, log_path: Path):
        self.proc = proc
        self.log_path = log_path
        self.seen: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def children(self) -> dict[int, str]:
        """pid -> title of each live child (workers and the heartbeat)."""
        try:
            kids = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return {}
        out = {}
        for kid in kids:
            self.seen.add(kid.pid)
            if running(kid.pid):
                out[kid.pid] = title(kid.pid)
        return out

    def workers(self) -> dict[int, str]:
        return {pid: t for pid, t in self.children().items() if t.startswith("pgfence worker ")}

    def heartbeat(self) -> dict[int, str]:
        return {pid: t for pid, t in self.children().items() if t.startswith("pgfence heartbeat")}

    def worker_pids_logged(self) -> set[int]:
        return {int(p) for p in re.findall(r"worker \d+ started \(pid (\d+)\)", self.log())}

    def forked(self) -> set[int]:
        """Every child pid the arbiter logged or the test saw."""
        return self.seen | {int(p) for p in STARTED.findall(self.log())}

    def leftovers(self) -> list[int]:
        return sorted(p for p in self.forked() | {self.pid} if ours(p))

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pgfence run still running after {timeout}s:\n{self.log()}") from None

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM to the arbiter alone; its exit status."""
        self.children()
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the arbiter and every child it has or had."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)     # it forks no more
            try:
                self.seen |= {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            self.proc.kill()
            self.proc.wait(10)
        pids = [p for p in self.forked() if ours(p)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not [p for p in pids if ours(p)], timeout=10, message="killed children gone")


@pytest.fixture
def runs(tmp_path):
    """Start ``pgfence run`` arbiters; all killed (with children) afterwards."""
    started: list[Run] = []

    def start(*args: str, dsn: str | None = None, env: dict[str, str] | None = None,
              name: str = "run") -> Run:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        with open(log_path, "w") as log:
            proc = spawn("run", *args, env=env or env_for(dsn), stdout=log, stderr=subprocess.STDOUT)
        run = Run(proc, log_path)
        started.append(run)
        return run

    try:
        yield start
    finally:
        for run in started:
            run.kill()


# -- looking at the database ------------------------------------------------------


def sessions(conn, app_like: str = "pgfence%") -> list[tuple]:
    """(pid, application_name, state, query, client_port) of this database's
    sessions but the test's own."""
    return conn.execute(
        "SELECT pid, application_name, state, query, client_port FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE %s"
        " ORDER BY pid", (app_like,)).fetchall()


def listening_workers(conn) -> int:
    """Worker sessions idle after their LISTEN, a claim or the look-ups of
    the next run_at and the next lease end, waiting for a NOTIFY (a worker
    LISTENs as soon as it connects, before its first claim)."""
    return sum(1 for _pid, _app, state, query, _port in sessions(conn, "pgfence worker %")
               if state == "idle" and (query in ("LISTEN pgfence_jobs", "LISTEN pgfence_pauses")
                                       or query.lstrip().startswith(("WITH candidates", "WITH RECURSIVE priorities",
                                                                     "SELECT extract(epoch FROM min(r.lease_until)",
                                                                     "SELECT queue\n  FROM pgfence.queue_pauses"))))


def counts(conn) -> list[tuple]:
    return conn.execute("SELECT status, attempt, reclaims, count(*) FROM pgfence.all_jobs"
                        " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3").fetchall()


def done_count(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'done'")


def password_dsn(dsn: str, password: str) -> str:
    params = conninfo_to_dict(dsn)
    params["password"] = password
    return make_conninfo("", **params)


def write_module(tmp_path: Path, name: str, source: str) -> dict[str, str]:
    """Write a handler module into tmp_path; the env that can import it."""
    (tmp_path / f"{name}.py").write_text(source)
    env = env_for()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return env


# -- 1. throughput, exactly once, one renewal statement per interval ----------------


def test_four_workers_run_a_thousand_jobs_once_with_one_renewal_statement_per_interval(dsn, conn, runs):
    """1,000 jobs, a few of them outliving the lease (renewed while noops
    churn through the other workers): every job done once on attempt 1, one
    effect row per effect job; the heartbeat sent at most one statement per
    round and no more rounds than the clock allows."""
    ids = [r[0] for r in conn.execute(
        "SELECT pgfence.enqueue(CASE WHEN i % 250 = 0 THEN 'effect' ELSE 'noop' END,"
        "                       CASE WHEN i % 250 = 0 THEN '{\"seconds\": 2.0}'::jsonb ELSE '{}'::jsonb END)"
        " FROM generate_series(1, 1000) AS i ORDER BY i")]
    effect_ids = ids[249::250]
    assert len(ids) == 1000 and len(effect_ids) == 4
    assert 2.0 > LEASE   # the effect jobs live only if their leases are renewed

    began = time.monotonic()
    run = runs("--workers", "4", "--lease", str(LEASE), dsn=dsn)
    wait_for(lambda: done_count(conn) == 1000, timeout=60, interval=0.1, message="all 1000 jobs done")
    assert run.stop() == 0
    elapsed = time.monotonic() - began

    assert counts(conn) == [("done", 1, 0, 1000)]
    effects = conn.execute("SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY job_id").fetchall()
    assert [(job_id, attempt) for job_id, attempt, _w in effects] == [(i, 1) for i in effect_ids]
    workers = run.worker_pids_logged()
    assert len(workers) == 4
    assert {int(w) for _j, _a, w in effects} <= workers

    log = run.log()
    started, restarts, rounds, statements = final_stats(log)
    assert (started, restarts) == (4, 0)
    assert 1 <= statements <= rounds, log
    # A round at start, then one per interval; 2 rounds of slack for timing.
    assert rounds <= elapsed / INTERVAL + 2, (rounds, elapsed)
    assert problems(log) == []
    assert run.leftovers() == []


# -- 2. process titles ----------------------------------------------------------------


MARKER = "payload-marker-7f3a9c"


def test_process_titles_show_roles_and_jobs_never_a_password_or_payload(dsn, conn, runs):
    secret = "s3cret-pw-41"
    secret_dsn = password_dsn(dsn, secret)
    with psycopg.connect(secret_dsn) as probe:   # trust auth takes any password
        assert probe.execute("SELECT 1").fetchone() == (1,)
    # The DSN on the command line: the title must replace the whole argv.
    run = runs("--dsn", secret_dsn, "--workers", "2", "--lease", str(LEASE), env=env_for())
    wait_for(lambda: listening_workers(conn) == 2, timeout=20, message="two workers listening")
    # The arbiter retitles itself on each turn of its loop (every 0.5 s).
    wait_for(lambda: title(run.pid) == "pgfence arbiter [2 workers] queues=default", timeout=5,
             message="the arbiter's title")
    assert sorted(run.workers().values()) == ["pgfence worker 1 idle", "pgfence worker 2 idle"]
    assert list(run.heartbeat().values()) == ["pgfence heartbeat [0 leases]"]

    job_id = scalar(conn, "SELECT pgfence.enqueue('sleep', %s::jsonb)",
                    (f'{{"seconds": 2.0, "note": "{MARKER}"}}',))
    busy = {f"pgfence worker {n} sleep job {job_id} attempt 1" for n in (1, 2)}
    titles = wait_for(lambda: (lambda t: t if busy & set(t) and "pgfence heartbeat [1 leases]" in t else None)(
        sorted(run.children().values())), timeout=10, message="the busy worker's and heartbeat's titles")
    runner = (busy & set(titles)).pop()
    other = 2 if runner.startswith("pgfence worker 1 ") else 1
    assert titles == sorted([runner, f"pgfence worker {other} idle", "pgfence heartbeat [1 leases]"])
    for pid in [run.pid, *run.children()]:
        raw = cmdline(pid)
        for needle in (secret, MARKER, "password", "dbname", "--dsn", "note"):
            assert needle.encode() not in raw, (pid, needle, raw)

    wait_for(lambda: job_row(conn, job_id)["status"] == "done", timeout=10, message="the sleep job done")
    wait_for(lambda: sorted(run.children().values()) == [
        "pgfence heartbeat [0 leases]", "pgfence worker 1 idle", "pgfence worker 2 idle"],
        timeout=5, message="titles back to idle")
    assert run.stop() == 0
    log = run.log()
    assert "pgfence run: 2 workers" in log
    assert secret not in log and "password" not in log
    assert MARKER not in log
    assert problems(log) == []
    assert run.leftovers() == []


# -- 3. the arbiter: one thread, no connection -------------------------------------------


def test_arbiter_has_one_thread_and_no_database_connection_before_and_after_a_fork(dsn, conn, backend, runs):
    run = runs("--workers", "2", "--lease", str(LEASE), dsn=dsn)
    for n in (2, 3):
        wait_for(lambda: listening_workers(conn) == n, timeout=20, message=f"{n} workers listening")
        wait_for(lambda: title(run.pid) == f"pgfence arbiter [{n} workers] queues=default", timeout=5,
                 message=f"the arbiter's title with {n} workers")
        assert threads(run.pid) == 1
        assert sockets(run.pid) == []
        assert psutil.Process(run.pid).net_connections(kind="all") == []
        workers = run.workers()
        assert len(workers) == n
        # Every worker session of the database is one of the children's.
        assert len(sessions(conn, "pgfence worker %")) == n
        if backend[0] == "server":   # TCP: map each session's port to its process
            ports = {c.laddr.port: pid for pid in run.children()
                     for c in psutil.Process(pid).net_connections(kind="inet")}
            owners = {ports.get(port) for _p, _a, _s, _q, port in sessions(conn)}
            assert owners <= set(run.children()) and run.pid not in owners and None not in owners, owners
            assert set(workers) <= owners
        if n == 2:
            os.kill(run.pid, signal.SIGTTIN)    # one worker more: a fork
    assert threads(run.pid) == 1
    assert run.stop() == 0
    assert final_stats(run.log())[:2] == (3, 0)
    assert run.leftovers() == []


# -- 4. wake-ups come by NOTIFY ----------------------------------------------------------


def test_idle_workers_pick_up_a_new_job_at_once_not_at_the_poll_interval(dsn, conn, runs):
    run = runs("--workers", "2", "--poll-interval", "30", "--lease", str(LEASE), dsn=dsn)
    wait_for(lambda: listening_workers(conn) == 2, timeout=20, message="two workers listening")
    waits = []
    for _ in range(10):
        job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
        wait_for(lambda: job_row(conn, job_id)["status"] == "done", timeout=5, message=f"job {job_id} done")
        waits.append(scalar(conn, "SELECT extract(epoch FROM started_at - created_at)::float8"
                                  " FROM pgfence.all_jobs WHERE id = %s", (job_id,)))
    assert max(waits) < 0.5, waits
    assert counts(conn) == [("done", 1, 0, 10)]
    assert run.stop() == 0
    assert run.leftovers() == []


# -- 5. handler modules that break -----------------------------------------------------------


def test_a_handler_module_that_fails_to_import_stops_run_with_one_line(dsn, conn, tmp_path):
    env = write_module(tmp_path, "pgfence_test_broken", 'raise ImportError("no such backend: frobnicator")\n')
    env["PGFENCE_DSN"] = dsn
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    began = time.monotonic()
    result = pgfence("run", "--workers", "2", "--handlers", "pgfence_test_broken", env=env, timeout=30)
    assert time.monotonic() - began < 10
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == ("pgfence: error: cannot import handler module 'pgfence_test_broken': "
                             "ImportError: no such backend: frobnicator\n")
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["started_at"]) == ("queued", 0, None)
    assert sessions(conn) == []


CRASH_MODULE = """\
import os

# Every process forked from here on dies at once, before it is up.
os.register_at_fork(after_in_child=lambda: os._exit(1))
"""


def test_workers_that_die_at_start_stop_the_arbiter_after_a_bounded_number_of_tries(dsn, conn, tmp_path, runs):
    env = write_module(tmp_path, "pgfence_test_crash", CRASH_MODULE)
    env["PGFENCE_DSN"] = dsn
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    began = time.monotonic()
    run = runs("--workers", "2", "--handlers", "pgfence.handlers.builtin,pgfence_test_crash", env=env)
    code = run.wait(30)
    assert time.monotonic() - began < 30
    log = run.log()
    assert code == 1, log
    errors = [line for line in log.splitlines() if line.startswith("pgfence: error: ")]
    assert len(errors) == 1, log
    # The workers (or the heartbeat manager, which dies the same way).
    assert re.search(r"keeps? dying at start \(\d+ in a row, last exited with status 1\); stopping$", errors[0])
    started = len(run.worker_pids_logged())
    assert started <= MAX_BOOT_FAILURES + 1, log   # 2 workers: one may be in flight
    assert final_stats(log)[0] == started
    # The heartbeat manager, forked as often as the workers, is not
    # restarted in a tight loop either.
    assert 1 <= log.count("heartbeat manager started") <= MAX_BOOT_FAILURES, log
    assert "Traceback" not in log
    assert run.leftovers() == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)


HEARTBEAT_CRASH_MODULE = """\
import os

from pgfence.renewal import process as renewal_process

# The arbiter forks its heartbeat managers after importing this module: each
# one dies at once, before its first round.  The workers are fine.
renewal_process.main = lambda *args: os._exit(1)
"""


def test_a_heartbeat_manager_that_dies_at_start_stops_the_arbiter_after_a_bounded_number_of_tries(
        dsn, conn, tmp_path, runs):
    env = write_module(tmp_path, "pgfence_test_hb_crash", HEARTBEAT_CRASH_MODULE)
    env["PGFENCE_DSN"] = dsn
    began = time.monotonic()
    run = runs("--workers", "2", "--handlers", "pgfence.handlers.builtin,pgfence_test_hb_crash", env=env)
    wait_for(lambda: listening_workers(conn) == 2, timeout=20, message="two workers listening")
    code = run.wait(30)
    assert time.monotonic() - began < 30
    log = run.log()
    assert code == 1, log
    errors = [line for line in log.splitlines() if line.startswith("pgfence: error: ")]
    assert errors == [f"pgfence: error: the heartbeat manager keeps dying at start ({MAX_BOOT_FAILURES} in a row,"
                      " last exited with status 1); stopping"], log
    assert log.count("heartbeat manager started") == MAX_BOOT_FAILURES, log
    assert final_stats(log)[:2] == (2, 0)
    assert "Traceback" not in log
    assert run.leftovers() == []
    assert sessions(conn) == []


METRICS_STARTED = re.compile(r"metrics server started \(pid (\d+)\) on http://")


def test_a_metrics_server_killed_at_start_again_and_again_comes_back_later_each_time_then_the_arbiter_halts(
        dsn, conn, runs):
    """The metrics server is supervised like the renewal process: killed
    once it was up, it is back at once; killed before it was up, it is back
    after a growing delay, and after MAX_BOOT_FAILURES such deaths in a row
    the arbiter halts instead of forking it on forever."""
    port = free_port()
    run = runs("--workers", "1", "--metrics-port", str(port), "--handlers", "pgfence.handlers.builtin", dsn=dsn)

    def started() -> list[int]:
        return [int(p) for p in METRICS_STARTED.findall(run.log())]

    def next_pid(after: int) -> tuple[int, float]:
        """Wait for the metrics server started after the ``after``-th; its
        pid and when this test saw it."""
        pids = wait_for(lambda: started() if len(started()) > after else None, timeout=30, interval=0.01,
                        message=f"metrics server #{after + 1} started")
        return pids[after], time.monotonic()

    first, first_seen = next_pid(0)
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n"), timeout=20)
    # Up: it lived longer than a start takes.
    wait_for(lambda: time.monotonic() - first_seen > METRICS_UP_AFTER + 0.2, timeout=10,
             message="the first metrics server up")
    os.kill(first, signal.SIGKILL)
    next_pid(1)
    assert "metrics server killed by SIGKILL; restarting it" in run.log()

    # Now each one is killed the moment it appears, before it is up.
    gaps = []
    killed_at = 0.0
    for n in range(1, MAX_BOOT_FAILURES + 1):
        pid, seen = next_pid(n)
        if n > 1:
            gaps.append(seen - killed_at)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

    assert run.wait(30) == 1, run.log()
    log = run.log()
    # Each restart waited at least its backoff (the delay counts from the
    # arbiter reaping the dead one, after this test killed it), and not much
    # more than that: the arbiter's loop wakes up for it.
    delays = [boot_backoff(failures) for failures in range(1, MAX_BOOT_FAILURES)]
    assert len(gaps) == len(delays) == MAX_BOOT_FAILURES - 1
    for gap, delay in zip(gaps, delays, strict=True):
        assert delay <= gap < delay + 3.0, (gaps, delays)
    assert gaps[-1] > gaps[0], gaps
    for delay in delays:
        assert f"metrics server killed by SIGKILL before it was up; restarting it in {delay:.1f}s" in log, log
    errors = [line for line in log.splitlines() if line.startswith("pgfence: error: ")]
    assert errors == [f"pgfence: error: the metrics server keeps dying at start ({MAX_BOOT_FAILURES} in a row,"
                      " last killed by SIGKILL); stopping"], log
    # The first one, its immediate replacement, and one per failure: no more.
    assert len(started()) == 1 + MAX_BOOT_FAILURES, log
    assert "Traceback" not in log
    assert run.leftovers() == []
    # A killed server's database session ends when its backend sees the
    # socket closed.
    wait_for(lambda: sessions(conn) == [], timeout=10, message="no pgfence session left")


# -- 6. settings -----------------------------------------------------------------------------


def test_invalid_run_settings_are_one_line_and_exit_2(dsn, conn, tmp_path):
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    toml = tmp_path / "zero.toml"
    toml.write_text("workers = 0\n")
    cases = [
        ((("--workers", "0"), {}), "invalid workers", "0"),
        (((), {"PGFENCE_WORKERS": "abc"}), "invalid workers", "'abc'"),
        ((("--graceful-timeout", "-1"), {}), "invalid graceful-timeout", "'-1'"),
        ((("--graceful-timeout", "0"), {}), "invalid graceful[-_]timeout", "0.0"),
        ((("--config", str(toml)), {}), "invalid workers", "0"),
        (((), {"PGFENCE_CONFIG": str(toml)}), "invalid workers", "0"),
    ]
    for (args, extra), what, value in cases:
        result = pgfence("run", *args, env=env_for(dsn, **extra), timeout=30)
        assert (result.returncode, result.stdout) == (2, ""), (args, extra, result)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, extra, result.stderr)
        assert re.match(f"pgfence: error: {what}: ", lines[0]), lines
        assert lines[0].endswith(f" {value}"), lines
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)
    assert sessions(conn) == []


def test_run_settings_precedence_toml_then_env_then_command_line(dsn, conn, tmp_path, runs):
    toml = tmp_path / "pgfence.toml"
    toml.write_text("[pgfence]\nworkers = 1\nqueues = ['toml']\n")
    cases = {
        3: runs("--workers", "3", env=env_for(dsn, PGFENCE_CONFIG=str(toml), PGFENCE_WORKERS="2")),
        2: runs(env=env_for(dsn, PGFENCE_CONFIG=str(toml), PGFENCE_WORKERS="2")),
        1: runs("--config", str(toml), dsn=dsn),
    }
    for n, run in cases.items():
        wait_for(lambda: title(run.pid) == f"pgfence arbiter [{n} workers] queues=toml" and len(run.workers()) == n,
                 timeout=20, message=f"the arbiter with {n} workers")
    wait_for(lambda: listening_workers(conn) == 6, timeout=20, message="all six workers listening")
    for n, run in cases.items():
        assert run.stop() == 0
        assert final_stats(run.log())[:2] == (n, 0)
        assert run.leftovers() == []


# -- 7. two instances, one queue ----------------------------------------------------------------


def test_two_instances_share_one_queue_without_running_a_job_twice(dsn, conn, runs):
    a = runs("--workers", "2", "--lease", str(LEASE), dsn=dsn, name="a")
    b = runs("--workers", "2", "--lease", str(LEASE), dsn=dsn, name="b")
    wait_for(lambda: listening_workers(conn) == 4, timeout=20, message="four workers listening")
    ids = [r[0] for r in conn.execute(
        "SELECT pgfence.enqueue('effect', '{\"seconds\": 0.01}') FROM generate_series(1, 300) ORDER BY 1")]
    wait_for(lambda: done_count(conn) == 300, timeout=60, interval=0.1, message="all 300 jobs done")
    pids_a, pids_b = a.worker_pids_logged(), b.worker_pids_logged()
    assert len(pids_a) == 2 and len(pids_b) == 2
    assert a.stop() == 0 and b.stop() == 0

    assert counts(conn) == [("done", 1, 0, 300)]
    effects = conn.execute("SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY job_id").fetchall()
    assert [(job_id, attempt) for job_id, attempt, _w in effects] == [(i, 1) for i in ids]
    by = [int(w) for _j, _a, w in effects]
    ran_a = sum(1 for w in by if w in pids_a)
    ran_b = sum(1 for w in by if w in pids_b)
    assert ran_a + ran_b == 300
    # Both instances, and each of their workers, took a share.
    assert set(by) == pids_a | pids_b
    assert min(ran_a, ran_b) >= 60, (ran_a, ran_b)
    for run in (a, b):
        assert final_stats(run.log())[:2] == (2, 0)
        assert problems(run.log()) == []
        assert run.leftovers() == []
