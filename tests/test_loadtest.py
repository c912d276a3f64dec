"""`pgfence loadtest` end to end: real `pgfence run` supervisors, a real
PostgreSQL, real signals, a real proxy partition and server restart.

A short seeded run with every fault must pass its audit, and its JSON must
show every fault injected and the exact job counts by final state per mix;
a run without the fence (`pgfence run --unprotected`) must fail its audit and
name the effect rows committed twice, exactly those the database holds.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pgtools import env_for, pgfence, scalar, spawn, wait_for

FAULTS = ["stop", "kill", "kill-heartbeat", "terminate", "partition", "restart", "xmin"]
FIRST_BACKEND = next(b.strip() for b in os.environ.get("PGFENCE_TEST_BACKENDS", "server,embedded").split(",")
                     if b.strip())

# 150 jobs of the default mix noop=40,sleep=30,fail=10,effect=10,receipt=10.
EXPECTED_150 = {
    "noop": {"count": 60, "expected": "done", "states": {"done": 60}},
    "sleep": {"count": 45, "expected": "done", "states": {"done": 45}},
    "fail": {"count": 15, "expected": "failed", "states": {"failed": 15}},
    "effect": {"count": 15, "expected": "done", "states": {"done": 15}},
    "receipt": {"count": 15, "expected": "done", "states": {"done": 15}},
}
FAULTY_RUN = ["--jobs", "150", "--supervisors", "2", "--workers", "3", "--lease", "2", "--sleep-mean", "0.3",
              "--sleep-max", "1.5", "--faults", "all", "--fault-interval", "1.2", "--timeout", "80", "--json"]


def loadtest(*args: str, dsn: str | None = None, timeout: float = 110) -> tuple[subprocess.CompletedProcess, dict]:
    started = time.monotonic()
    proc = pgfence("loadtest", *args, dsn=dsn, timeout=timeout)
    elapsed = time.monotonic() - started
    assert "Traceback" not in proc.stderr, proc.stderr
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON report (exit {proc.returncode}): {proc.stderr[-2000:]}") from None
    report["_test_elapsed"] = elapsed
    return proc, report


def failed_checks(report: dict) -> list[dict]:
    return [c for c in report["audit"]["checks"] if not c["passed"]]


def assert_faulty_run_passed(proc: subprocess.CompletedProcess, report: dict, *, restart: bool) -> None:
    assert failed_checks(report) == [], json.dumps(report["audit"], indent=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["audit"]["passed"] is True
    assert report["timed_out"] is False
    assert report["summary"]["by_mix"] == EXPECTED_150
    assert report["summary"]["ended"] == 150
    faults = report["faults"]
    injected = faults["injected"]
    assert sorted(injected) == sorted(FAULTS)
    expected_faults = [f for f in FAULTS if restart or f != "restart"]
    assert [f for f in FAULTS if injected[f] >= 1] == expected_faults, injected
    if restart:
        assert faults["skipped"] == {}
        assert faults["server_restarts"] == injected["restart"]
    else:
        assert faults["skipped"] == {"restart": "the load test does not control the server (run with --embedded)"}
        assert injected["restart"] == 0 and faults["server_restarts"] == 0
    events = faults["events"]
    assert len(events) == sum(injected.values())
    assert {f: sum(1 for e in events if e["fault"] == f) for f in FAULTS} == injected
    assert sum(e["workers"] for e in events if e["fault"] == "terminate") == faults["terminated"]["worker"]
    assert sum(e["heartbeats"] for e in events if e["fault"] == "terminate") == faults["terminated"]["heartbeat"]
    metrics = report["metrics"]
    # Every SIGKILLed worker child is an unplanned death the arbiter counts.
    assert metrics["worker_restarts_total"] >= injected["kill"]
    assert metrics["reclaims_total"] <= report["database"]["reclaims"]
    assert metrics["lease_lost_total"]["fence_rejected"] <= metrics["double_run_prevented_total"]
    # Every receipt job sent under its one key, and each email was sent once.
    assert report["email"]["distinct_keys"] == 15


@pytest.mark.timeout(150)
def test_every_fault_on_a_server_the_loadtest_owns_passes_the_audit():
    """--embedded: the load test's own PostgreSQL (Unix socket upstream), so
    the restart fault is on too."""
    proc, report = loadtest("--embedded", "--seed", "11", *FAULTY_RUN)
    assert_faulty_run_passed(proc, report, restart=True)
    assert report["_test_elapsed"] < 100


@pytest.mark.timeout(150)
def test_every_fault_against_a_database_it_does_not_own_passes_the_audit(backend, dsn, conn):
    """The test's database over TCP: every fault but the restart, which is
    reported as skipped; the JSON agrees with the database row for row."""
    if backend[0] != "server":
        pytest.skip("the --embedded run covers pgfence's embedded PostgreSQL, restarts included")
    proc, report = loadtest("--seed", "12", *FAULTY_RUN, dsn=dsn)
    assert_faulty_run_passed(proc, report, restart=False)
    queue = report["queue"]
    rows = conn.execute("SELECT kind, status, count(*) FROM pgfence.all_jobs WHERE queue = %s GROUP BY kind, status "
                        "ORDER BY kind, status", (queue,)).fetchall()
    assert rows == [("effect", "done", 15), ("fail", "failed", 15), ("noop", "done", 60),
                    ("send_receipt", "done", 15), ("sleep", "done", 45)]
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE queue <> %s", (queue,)) == 0
    for table in ("effects", "receipts"):
        per_job = conn.execute(f"SELECT t.job_id, count(*) FROM pgfence_examples.{table} t JOIN pgfence.all_jobs j "
                               f"ON j.id = t.job_id WHERE j.queue = %s GROUP BY t.job_id", (queue,)).fetchall()
        assert len(per_job) == 15 and {n for _job, n in per_job} == {1}
    assert report["database"]["reclaims"] == scalar(
        conn, "SELECT sum(reclaims) FROM pgfence.all_jobs WHERE queue = %s", (queue,))
    assert report["database"]["attempts"] == scalar(
        conn, "SELECT sum(attempt) FROM pgfence.all_jobs WHERE queue = %s", (queue,))
    # Everything it started is gone: no worker or heartbeat connection left.
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND application_name LIKE 'pgfence %%'") == 0,
             timeout=10, message="no pgfence connection left")
    assert report["_test_elapsed"] < 100


@pytest.mark.timeout(120)
def test_the_xmin_fault_holds_the_horizon_then_ends_and_the_audit_passes(backend, dsn, conn):
    """--faults xmin: a REPEATABLE READ transaction with its snapshot taken
    holds the horizon for --xmin-hold seconds, then ends; the run passes its
    audit and the report records each hold with the throughput around it."""
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc = spawn("loadtest", "--jobs", "300", "--mix", "noop=1,sleep=1", "--sleep-mean", "0.1", "--sleep-max", "0.3",
                 "--supervisors", "1", "--workers", "4", "--faults", "xmin", "--xmin-hold", "3",
                 "--fault-interval", "1", "--seed", "13", "--timeout", "80", "--json", dsn=dsn)
    holding = ("SELECT pid, backend_xmin::text::bigint FROM pg_stat_activity WHERE datname = current_database() "
               "AND application_name = 'pgfence loadtest xmin' AND state = 'idle in transaction' "
               "AND backend_xmin IS NOT NULL")
    try:
        seen = wait_for(lambda: conn.execute(holding).fetchall(), timeout=60, message="the held snapshot")
        out, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err
    report = json.loads(out)
    assert failed_checks(report) == [], json.dumps(report["audit"], indent=2)
    assert proc.returncode == 0 and report["summary"]["ended"] == 300
    assert report["summary"]["by_mix"] == {"noop": {"count": 150, "expected": "done", "states": {"done": 150}},
                                           "sleep": {"count": 150, "expected": "done", "states": {"done": 150}}}
    faults = report["faults"]
    events = faults["events"]
    assert faults["injected"] == {"xmin": len(events)} and len(events) >= 1
    assert all(e["fault"] == "xmin" and e["seconds"] == 3.0 for e in events)
    assert (events[0]["pid"], events[0]["xmin"]) == seen[0]
    assert [(h["t"], h["seconds"]) for h in faults["xmin_holds"]] == [(e["t"], 3.0) for e in events]
    assert all(set(h) == {"t", "seconds", "before", "during", "after"} for h in faults["xmin_holds"])
    # Every hold ended with the run: nothing holds the horizon any more.
    assert conn.execute(holding).fetchall() == []
    # No job changed hands: a held horizon slows claims, it takes no lease.
    assert report["database"]["reclaims"] == 0


def test_xmin_holds_are_reported_with_the_throughput_around_them():
    import datetime

    from pgfence.tools.loadtest import report as report_mod

    zero = datetime.datetime(2026, 12, 4, tzinfo=datetime.timezone.utc)
    # 10 jobs/s for 10 s, 2 jobs/s during the hold (10 s to 20 s), 10 jobs/s after.
    ended = [i / 10 for i in range(100)] + [10 + i / 2 for i in range(20)] + [20 + i / 10 for i in range(100)]
    jobs = [{"finished_at": zero + datetime.timedelta(seconds=t)} for t in ended] + [{"finished_at": None}]
    events = [{"t": 3.0, "fault": "stop", "seconds": 2.0}, {"t": 10.0, "fault": "xmin", "pid": 7, "xmin": 9,
                                                           "seconds": 10.0}]
    holds = report_mod.around_holds(jobs, events, zero)
    assert holds == [{"t": 10.0, "seconds": 10.0, "before": 10.0, "during": 2.0, "after": 10.0}]
    assert report_mod.around_holds(jobs, events, None) == []


def test_the_chart_counts_job_ends_on_the_faults_clock():
    """Job ends and fault events on one time line: from the database clock
    when the faults' clock started, not from the first enqueue (an enqueue
    of 300,000 jobs took 20 s, and the chart drew every fault 20 s early
    against the jobs)."""
    import datetime

    from pgfence.tools.loadtest import report as report_mod

    enqueued = datetime.datetime(2026, 12, 4, tzinfo=datetime.timezone.utc)
    zero = enqueued + datetime.timedelta(seconds=20)
    jobs = [{"created_at": enqueued, "finished_at": zero + datetime.timedelta(seconds=s)} for s in (1.5, 3.0)]
    jobs.append({"created_at": enqueued, "finished_at": None})
    assert report_mod.ended_since(jobs, zero) == [1.5, 3.0]
    assert report_mod.ended_since(jobs, None) == [21.5, 23.0]
    assert report_mod.ended_since([], None) == []


@pytest.mark.timeout(120)
def test_without_the_fence_the_audit_names_the_effects_committed_twice(backend, dsn, conn):
    """`pgfence run --unprotected` (no renewal, no fence), effect jobs three
    times longer than the lease, workers to spare and SIGSTOPs: jobs are
    reclaimed while they run and both attempts commit their effect row."""
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc, report = loadtest("--unprotected", "--mix", "effect=1", "--jobs", "3", "--supervisors", "1",
                            "--workers", "4", "--lease", "1", "--sleep-mean", "3", "--sleep-max", "3",
                            "--faults", "stop", "--fault-interval", "1", "--seed", "20", "--timeout", "60",
                            "--json", dsn=dsn)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["audit"]["passed"] is False
    assert report["faults"]["injected"]["stop"] >= 1
    effects = next(c for c in report["audit"]["checks"] if c["name"] == "effects committed once")
    assert effects["passed"] is False
    rows = conn.execute(
        "SELECT t.job_id, array_agg(t.id ORDER BY t.id), array_agg(t.attempt ORDER BY t.id), "
        "array_agg(t.worker ORDER BY t.id) FROM pgfence_examples.effects t JOIN pgfence.all_jobs j ON j.id = t.job_id "
        "WHERE j.queue = %s GROUP BY t.job_id HAVING count(*) > 1 ORDER BY t.job_id", (report["queue"],)).fetchall()
    assert rows, "the unprotected run committed no effect twice"
    assert effects["duplicates"] == [{"job": job, "rows": ids, "attempts": attempts, "workers": workers}
                                     for job, ids, attempts, workers in rows]
    assert effects["detail"].startswith(f"{len(rows)} job(s) with more than one row")
    # Only the effects check fails: every job still ended done.
    assert [c["name"] for c in failed_checks(report)] == ["effects committed once"]
    assert report["summary"]["by_mix"] == {"effect": {"count": 3, "expected": "done", "states": {"done": 3}}}


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}/task").exists() else []:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(90)
def test_ctrl_c_stops_everything_it_started(backend, dsn, conn):
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc = spawn("loadtest", "--jobs", "40", "--mix", "sleep=1", "--sleep-mean", "5", "--sleep-max", "5",
                 "--supervisors", "2", "--workers", "2", "--faults", "stop", "--fault-interval", "1", "--json",
                 dsn=dsn)
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'running'") == 4,
                 timeout=40, message="four running jobs")
        started = _descendants(proc.pid)
        titles = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in started if _alive(pid)}
        assert sum(1 for t in titles.values() if t.startswith(b"pgfence arbiter")) == 2, titles
        assert sum(1 for t in titles.values() if t.startswith(b"pgfence worker")) == 4, titles
        proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - interrupted < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert out == ""
    assert [pid for pid in started if _alive(pid)] == []
    # The supervisors were stopped first, then the jobs left were cancelled.
    states = dict(conn.execute("SELECT status, count(*) FROM pgfence.all_jobs GROUP BY status").fetchall())
    assert set(states) <= {"done", "cancelled"} and sum(states.values()) == 40, states
    queue = scalar(conn, "SELECT DISTINCT queue FROM pgfence.all_jobs")
    assert err.strip().splitlines()[-2:] == [
        f"pgfence loadtest: cancelled {states['cancelled']} job(s) left in queue {queue}", "pgfence: interrupted"]
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND application_name LIKE 'pgfence %%'") == 0,
             timeout=10, message="no pgfence connection left")


@pytest.mark.timeout(90)
def test_plot_and_progress(backend, dsn, tmp_path):
    pytest.importorskip("matplotlib")
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    png = tmp_path / "run.png"
    # Bytes, not text: universal newlines would turn the progress line's \r into \n.
    proc = subprocess.run([sys.executable, "-m", "pgfence", "loadtest", "--jobs", "60", "--supervisors", "1",
                           "--workers", "3", "--sleep-mean", "0.1", "--sleep-max", "0.5", "--seed", "3",
                           "--plot", str(png), "--progress"], env=env_for(dsn), capture_output=True, timeout=80, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-2000:]
    out = proc.stdout.decode().splitlines()
    assert out[0].startswith("pgfence loadtest: 60 jobs, 1 supervisor(s) x 3 worker(s), lease 5s, seed 3, queue ")
    assert "audit: PASS" in out
    # One line rewritten in place (no newline but the last), ending at 60/60.
    assert err.startswith("\r[") and err.endswith("\n") and err.count("\n") == 1, err
    assert err.rstrip().rsplit("\r", 1)[1].startswith("[" + "#" * 30 + "] 60/60 ended, 0 running, ")
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1000, 600)


def test_plot_without_matplotlib_is_one_clear_error(tmp_path):
    # A matplotlib that cannot be imported, first on the path.
    (tmp_path / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = env_for(None, PYTHONPATH=f"{tmp_path}{os.pathsep}{env_for(None)['PYTHONPATH']}")
    proc = pgfence("loadtest", "--plot", str(tmp_path / "x.png"), env=env)
    assert proc.returncode == 2
    assert proc.stderr == "pgfence: error: --plot needs matplotlib: pip install 'pgfence[loadtest]'\n"
    assert proc.stdout == ""


def test_the_proxy_forwards_knows_its_backends_and_blackholes_a_link(dsn):
    """Through the proxy to the test's server (TCP or Unix socket): it learns
    each connection's backend pid; a cut link leaves a new connection
    unanswered until libpq's connect timeout, while the other link works;
    healed, the held connection goes on."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from pgfence.tools.loadtest.proxy import Proxy
    from pgfence.tools.loadtest.server import Server

    server = Server(dsn)
    proxy = Proxy(server.upstream)
    try:
        via = [server.client_dsn("127.0.0.1", port) for port in proxy.start(2)]
        # sslmode=prefer: the proxy answers the SSL request with "no" itself.
        with psycopg.connect(via[0], autocommit=True) as c0, \
                psycopg.connect(make_conninfo(via[1], sslmode="prefer"), autocommit=True) as c1:
            pids = {c0.info.backend_pid, c1.info.backend_pid}
            assert proxy.backend_pids() == pids
            assert c0.execute("SELECT pg_backend_pid()").fetchone() == (c0.info.backend_pid,)
            proxy.partition(0)
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="timeout expired"):
                psycopg.connect(make_conninfo(via[0], connect_timeout=2))
            assert time.monotonic() - started >= 1.9
            assert c1.execute("SELECT 2").fetchone() == (2,)
            proxy.heal(0)
            assert c0.execute("SELECT 3").fetchone() == (3,)
        # (The timed-out attempt's socket lives on in psycopg until collected:
        # healed, its startup went through, so only these two are checked.)
        wait_for(lambda: not proxy.backend_pids() & pids, timeout=5, message="their backends gone from the proxy")
    finally:
        proxy.stop()


def test_the_mix_is_split_exactly_by_largest_remainder():
    from pgfence.tools.loadtest.mix import allocate

    none = {"asleep": 0, "aeffect": 0, "limited": 0, "keyed": 0}
    assert allocate(150, {"noop": 40, "sleep": 30, "fail": 10, "effect": 10, "receipt": 10}) == {
        "noop": 60, "sleep": 45, "fail": 15, "effect": 15, "receipt": 15, **none}
    assert allocate(7, {"noop": 1, "sleep": 1, "fail": 1}) == {
        "noop": 3, "sleep": 2, "fail": 2, "effect": 0, "receipt": 0, **none}
    assert allocate(1, {"receipt": 3, "effect": 1}) == {
        "noop": 0, "sleep": 0, "fail": 0, "effect": 0, "receipt": 1, **none}
    assert allocate(300, {"noop": 20, "sleep": 20, "asleep": 20, "effect": 15, "aeffect": 15, "fail": 10}) == {
        "noop": 60, "sleep": 60, "fail": 30, "effect": 45, "receipt": 0, "asleep": 60, "aeffect": 45, "limited": 0,
        "keyed": 0}
    assert allocate(10, {"noop": 1, "limited": 2, "keyed": 2}) == {
        **dict.fromkeys(("sleep", "fail", "effect", "receipt", "asleep", "aeffect"), 0), "noop": 2, "limited": 4,
        "keyed": 4}


def test_async_jobs_load_the_async_handlers_and_draw_their_seconds_like_sleep():
    """asleep/aeffect run async_sleep/async_effect (pgfence.handlers.aio,
    loaded only when the mix has them), with `seconds` drawn as for sleep
    and effect: the same seeded draws, cut at --sleep-max."""
    import random

    from pgfence.handlers.payloads import seconds_of
    from pgfence.tools.loadtest.mix import handler_modules, make_jobs

    assert handler_modules({"noop": 1, "effect": 1}) == ["pgfence.handlers.builtin", "pgfence.handlers.receipts"]
    assert handler_modules({"noop": 1, "asleep": 0}) == ["pgfence.handlers.builtin", "pgfence.handlers.receipts"]
    assert handler_modules({"aeffect": 1}) == ["pgfence.handlers.builtin", "pgfence.handlers.receipts",
                                               "pgfence.handlers.aio"]
    counts = {"sleep": 200, "effect": 200, "asleep": 200, "aeffect": 200}
    specs = make_jobs(counts, random.Random(4), sleep_mean=0.4, sleep_max=1.5)
    kinds = {s.mix: s.kind for s in specs}
    assert kinds == {"sleep": "sleep", "effect": "effect", "asleep": "async_sleep", "aeffect": "async_effect"}
    for name in counts:
        seconds = [s.payload["seconds"] for s in specs if s.mix == name]
        assert all(0 <= x <= 1.5 for x in seconds) and max(seconds) == 1.5, name
        assert 0.25 < sum(seconds) / len(seconds) < 0.5, name
        assert {(s.max_attempts, s.max_reclaims) for s in specs if s.mix == name} == {(10, 8)}
    # The payload the handlers read: what they would wait.
    from types import SimpleNamespace

    spec = next(s for s in specs if s.mix == "aeffect")
    assert seconds_of(SimpleNamespace(payload=spec.payload)) == spec.payload["seconds"]  # type: ignore[arg-type]


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "invalid --jobs: must be from 1 to 10000000, got 0"),
    (["--jobs", "many"], "invalid --jobs: expected a whole number, got 'many'"),
    (["--supervisors", "0"], "invalid --supervisors: must be from 1 to 64, got 0"),
    (["--mix", "noop=1,bogus=2"],
     "invalid --mix: unknown job type 'bogus' (known: noop, sleep, fail, effect, receipt, asleep, aeffect, limited, "
     "keyed)"),
    (["--mix", "noop"],
     "invalid --mix: 'noop' is not NAME=WEIGHT (names: noop, sleep, fail, effect, receipt, asleep, aeffect, limited, "
     "keyed)"),
    (["--mix", "noop=0"], "invalid --mix: give at least one job type a positive weight"),
    (["--mix", "noop=-1"], "invalid --mix: the weight of 'noop' must be 0 or more, got -1"),
    (["--faults", "stop,explode"],
     ("invalid --faults: unknown fault 'explode' (known: stop, kill, kill-heartbeat, terminate, partition, restart, "
      "xmin, all, none)")),
    (["--xmin-hold", "0"], "invalid --xmin-hold: must be a positive number of seconds, got '0'"),
    (["--sleep-mean", "3", "--sleep-max", "1"], "invalid --sleep-mean: 3s is longer than --sleep-max (1s)"),
    (["--lease", "0.1"], "invalid --lease: must be at least 0.5 seconds, got '0.1'"),
    (["--threads", "0"], "invalid --threads: must be from 1 to 1000, got 0"),
    (["--threads", "1001"], "invalid --threads: must be from 1 to 1000, got 1001"),
    (["--threads", "eight"], "invalid --threads: expected a whole number, got 'eight'"),
    (["--async-concurrency", "0"], "invalid --async-concurrency: must be from 1 to 10000, got 0"),
    (["--async-concurrency", "10001"], "invalid --async-concurrency: must be from 1 to 10000, got 10001"),
    (["--async-concurrency", "1.5"], "invalid --async-concurrency: expected a whole number, got '1.5'"),
    (["--batch", "0"], "invalid --batch: must be from 1 to 1000, got 0"),
    (["--timeout", "soon"], "invalid --timeout: expected seconds (like 30, 30s, 5m, 7d), got 'soon'"),
    (["--embedded", "--dsn", "postgresql://postgres@127.0.0.1/x"], "give --embedded or --dsn, not both"),
    (["--dsn", "postgresql://postgres@db.example.com/x"],
     "the load test runs only against a PostgreSQL on this host (loopback or a Unix socket), not 'db.example.com'"),
    (["--dsn", "host=127.0.0.1,10.1.2.3 dbname=x"],
     "the load test runs only against a PostgreSQL on this host (loopback or a Unix socket), not '10.1.2.3'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = pgfence("loadtest", *args, timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"pgfence: error: {message}\n")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_through_pgbouncer_in_transaction_pooling(backend, dsn):
    """Slow, and needs Debian's pgbouncer: 2 x 8 workers through PgBouncer
    (workers poll), every fault."""
    from pgfence.tools.loadtest.pgbouncer import find

    if find() is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc, report = loadtest("--pgbouncer", "--seed", "13", *FAULTY_RUN[:4], "--workers", "8", *FAULTY_RUN[6:],
                            dsn=dsn, timeout=250)
    assert report["config"]["pgbouncer"] is True
    assert_faulty_run_passed(proc, report, restart=False)


# -- many jobs per worker: threads and an async mix ------------------------------------------

CONCURRENT_MIX = "noop=20,sleep=20,asleep=20,effect=15,aeffect=15,fail=10"


def concurrent_expected(total: int) -> dict:
    """by_mix of CONCURRENT_MIX for 100 x n jobs: every job in its final state."""
    n = total // 100
    counts = {"noop": 20 * n, "sleep": 20 * n, "fail": 10 * n, "effect": 15 * n, "asleep": 20 * n,
              "aeffect": 15 * n}
    return {name: {"count": c, "expected": "failed" if name == "fail" else "done",
                   "states": {"failed" if name == "fail" else "done": c}} for name, c in counts.items()}


def assert_effects_once(conn, queue: str, per_kind: int) -> None:
    """Each effect and async_effect job done, with exactly one effect row
    committed by the attempt that completed it."""
    rows = conn.execute(
        "SELECT j.kind, j.id, j.attempt, count(t.id), min(t.attempt) FROM pgfence.all_jobs j "
        "LEFT JOIN pgfence_examples.effects t ON t.job_id = j.id WHERE j.queue = %s "
        "AND j.kind IN ('effect', 'async_effect') GROUP BY j.kind, j.id, j.attempt", (queue,)).fetchall()
    assert sorted({kind for kind, *_ in rows}) == ["async_effect", "effect"]
    for kind in ("effect", "async_effect"):
        mine = [r for r in rows if r[0] == kind]
        assert len(mine) == per_kind, kind
        assert [r for r in mine if r[3] != 1 or r[4] != r[2]] == [], kind
    # No effect row of the run's jobs but theirs.
    assert scalar(conn, "SELECT count(*) FROM pgfence_examples.effects t JOIN pgfence.all_jobs j ON j.id = t.job_id "
                        "WHERE j.queue = %s", (queue,)) == 2 * per_kind


@pytest.mark.timeout(90)
def test_a_fault_free_run_with_threads_and_async_jobs_hands_nothing_over(backend, dsn, conn):
    """2 workers of 4 threads and a 20-slot event loop each, the async mix:
    every job once (the fail jobs twice: they raise), effect rows once."""
    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc, report = loadtest("--jobs", "300", "--supervisors", "1", "--workers", "2", "--threads", "4",
                            "--async-concurrency", "20", "--mix", CONCURRENT_MIX, "--sleep-mean", "0.05",
                            "--sleep-max", "0.3", "--lease", "3", "--seed", "31", "--faults", "none",
                            "--timeout", "60", "--json", dsn=dsn)
    assert failed_checks(report) == [], json.dumps(report["audit"], indent=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = report["config"]
    assert (config["threads"], config["async_concurrency"], config["capacity"], config["batch"]) == (4, 20, 24, None)
    assert report["summary"]["by_mix"] == concurrent_expected(300)
    assert report["summary"]["ended"] == 300
    assert report["database"] == {"reclaims": 0, "attempts": 330, "extra_attempts": 30, "failed_at_claim": 0}
    metrics = report["metrics"]
    assert (metrics["reclaims_total"], metrics["double_run_prevented_total"], metrics["worker_restarts_total"]) == (
        0, 0, 0)
    assert metrics["jobs_claimed_total"] == 330
    assert sum(metrics["lease_lost_total"].values()) == 0
    checks = {c["name"]: c for c in report["audit"]["checks"]}
    assert checks["extra attempts explained"]["unexplained_count"] == 0
    assert checks["no deadlocks"]["deadlocks"] == 0
    queue = report["queue"]
    assert_effects_once(conn, queue, 45)
    rows = conn.execute("SELECT kind, status, count(*) FROM pgfence.all_jobs WHERE queue = %s GROUP BY kind, status "
                        "ORDER BY kind, status", (queue,)).fetchall()
    assert rows == [("async_effect", "done", 45), ("async_sleep", "done", 60), ("effect", "done", 45),
                    ("fail", "failed", 30), ("noop", "done", 60), ("sleep", "done", 60)]
    assert report["_test_elapsed"] < 45


CONCURRENT_FAULTY_RUN = ["--jobs", "200", "--supervisors", "2", "--workers", "2", "--threads", "4",
                         "--async-concurrency", "20", "--mix", CONCURRENT_MIX, "--lease", "2", "--sleep-mean", "0.3",
                         "--sleep-max", "1.5", "--faults", "all", "--fault-interval", "1.2", "--timeout", "80",
                         "--json"]


def assert_concurrent_faulty_run_passed(proc, report, conn, *, restart: bool) -> None:
    assert failed_checks(report) == [], json.dumps(report["audit"], indent=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["audit"]["passed"] is True and report["timed_out"] is False
    assert report["config"]["capacity"] == 24
    assert report["summary"]["by_mix"] == concurrent_expected(200)
    assert report["summary"]["ended"] == 200
    injected = report["faults"]["injected"]
    assert [f for f in FAULTS if injected[f] >= 1] == [f for f in FAULTS if restart or f != "restart"], injected
    # Each signal hit a whole child: its title said how many jobs it held.
    for event in report["faults"]["events"]:
        if event["fault"] in ("stop", "kill"):
            assert isinstance(event["jobs"], int) and 0 <= event["jobs"] <= 24, event
    metrics = report["metrics"]
    assert metrics["worker_restarts_total"] >= injected["kill"]
    assert metrics["reclaims_total"] <= report["database"]["reclaims"]
    assert metrics["lease_lost_total"].get("fence_rejected", 0) <= metrics["double_run_prevented_total"]
    effects = next(c for c in report["audit"]["checks"] if c["name"] == "effects committed once")
    assert (effects["duplicates"], effects["missing"]) == ([], [])
    if conn is not None:
        assert_effects_once(conn, report["queue"], 30)


@pytest.mark.timeout(150)
def test_every_fault_with_threads_and_async_jobs_passes_the_audit(backend, dsn, conn):
    """Threads and an event loop in every child, every fault but the
    restart: a SIGSTOP or SIGKILL takes all of a child's jobs at once, and
    still each effect commits exactly once and every job ends as its mix
    says."""
    if backend[0] != "server":
        pytest.skip("the test server over TCP; the --embedded run covers the restart")
    proc, report = loadtest("--seed", "32", *CONCURRENT_FAULTY_RUN, dsn=dsn)
    assert_concurrent_faulty_run_passed(proc, report, conn, restart=False)
    assert report["_test_elapsed"] < 100


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_every_fault_with_threads_and_async_jobs_on_a_server_the_loadtest_owns_passes_the_audit():
    """The same with --embedded, so the server restart too (every pool
    connection of every child broken at once).  Faults every 1.2 s, a restart
    among them every six or so, slow the jobs down: the deadline is longer."""
    run = [*CONCURRENT_FAULTY_RUN]
    run[run.index("--timeout") + 1] = "150"
    proc, report = loadtest("--embedded", "--seed", "33", *run, timeout=230)
    assert_concurrent_faulty_run_passed(proc, report, None, restart=True)
    assert report["faults"]["server_restarts"] == report["faults"]["injected"]["restart"] >= 1
