"""Metrics from every process of a real `pgfence run`, the health endpoints and
systemd's notify protocol."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from metricstools import children, free_port, http_get, reclaim_and_reject, samples, total, worker_pids
from pgtools import env_for, spawn, wait_for
from pgfence import enqueue



def test_reclaim_and_fenced_rejection_are_counted_across_exited_children(dsn, conn, runs):
    run = runs(dsn, "--workers", "2", "--lease", "1.5")
    job_id = reclaim_and_reject(conn)
    assert conn.execute("SELECT attempt FROM pgfence_examples.effects WHERE job_id = %s", (job_id,)).fetchall() == [(2,)]

    # Every child that counted something leaves: HUP swaps them all.
    old = set(worker_pids(run.proc.pid))
    run.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: not (old & set(worker_pids(run.proc.pid))) and len(worker_pids(run.proc.pid)) == 2,
             timeout=30, message="all workers replaced")
    # An old child that has exited but is not yet reaped still counts in the
    # live gauge until the arbiter reaps it and drops its file.
    parsed = wait_for(lambda: (lambda p: p if total(p, "pgfence_workers") == 2 else None)(run.scrape()),
                      timeout=10, message="the exited children's gauge files dropped")
    labels = {"queue": "default", "kind": "stubborn"}
    assert total(parsed, "pgfence_reclaims_total", **labels) == 1
    assert total(parsed, "pgfence_double_run_prevented_total", **labels) == 1
    assert total(parsed, "pgfence_lease_lost_total", **labels) == 1
    # The frozen attempt learns it once, by whichever comes first when it
    # wakes: the fence, a renewal refused, or its own lease deadline passed
    # with no renewal (expired: nobody renewed a stopped child; nothing failed).
    lost = {dict(ls)["reason"]: v for (n, ls), v in parsed.items() if n == "pgfence_lease_lost_total" and v}
    assert list(lost.values()) == [1.0]
    assert set(lost) <= {"fence_rejected", "renewal_rejected", "expired"}
    assert total(parsed, "pgfence_jobs_claimed_total", **labels) == 2
    assert total(parsed, "pgfence_jobs_completed_total", **labels) == 1
    assert total(parsed, "pgfence_workers") == 2


def test_readyz_follows_the_workers_and_healthz_the_arbiter(dsn, conn, runs):
    run = runs(dsn, "--workers", "2", "--lease", "3")
    assert http_get(run.url("/healthz")) == (200, "ok\n")
    assert http_get(run.url("/readyz")) == (200, "2 workers up, database answers\n")
    one = worker_pids(run.proc.pid)[0]
    os.kill(one, signal.SIGSTOP)
    try:
        wait_for(lambda: http_get(run.url("/readyz")) == (503, "1 of 2 workers up\n"), timeout=10)
        # Liveness is the arbiter's loop only: a stuck worker does not fail it.
        assert http_get(run.url("/healthz")) == (200, "ok\n")
    finally:
        os.kill(one, signal.SIGCONT)
    wait_for(lambda: http_get(run.url("/readyz"))[0] == 200, timeout=10)
    assert http_get(run.url("/nope"))[0] == 404


def one_worker_with_metrics_dir(backend, dsn, conn, runs, tmp_path):
    """(run, its metrics directory): one worker that has done one job.  One
    backend is enough for the tests that read the metrics files."""
    if backend[0] != "server":
        pytest.skip("one backend is enough: this reads the metrics files, not the database")
    metrics_dir = tmp_path / "metrics"
    run = runs(dsn, "--workers", "1", "--lease", "3", "--metrics-dir", str(metrics_dir))
    enqueue(conn, "noop")
    wait_for(lambda: total(run.try_scrape(), "pgfence_jobs_completed_total") == 1)
    return run, metrics_dir


@pytest.mark.parametrize("restarts", [pytest.param(40, id="40"), pytest.param(200, id="200", marks=pytest.mark.slow)])
def test_many_restarts_leave_no_per_process_series(backend, dsn, conn, runs, tmp_path, restarts):
    """Forty restarts in the default suite (every dead child's files merged
    and its live gauges removed), two hundred with -m slow (.ci/run)."""
    run, metrics_dir = one_worker_with_metrics_dir(backend, dsn, conn, runs, tmp_path)
    for i in range(restarts):
        pids = worker_pids(run.proc.pid)
        assert len(pids) == 1
        # Each child does a job first, so that it leaves metric files behind.
        enqueue(conn, "noop")
        # Counted after its commit: wait for the count, not for the row.
        wait_for(lambda: total(run.try_scrape(), "pgfence_jobs_completed_total") == i + 2, interval=0.005)
        os.kill(pids[0], signal.SIGKILL)
        # The next one must be up (connected) before it is killed, or its
        # death counts as a failure to start and the arbiter halts.
        wait_for(lambda: (p := worker_pids(run.proc.pid)) and p[0] != pids[0]
                 and http_get(run.url("/readyz"))[0] == 200, timeout=20, interval=0.01,
                 message=f"worker {i + 2} up")
    # The arbiter sets the workers gauge on its next turn (every half second).
    wait_for(lambda: total(run.try_scrape(), "pgfence_workers") == 1, timeout=10)
    started = time.perf_counter()
    status, text = http_get(run.url("/metrics"))
    elapsed = time.perf_counter() - started
    print(f"\nscrape after {restarts} restarts: {elapsed * 1000:.1f} ms, {len(text)} bytes, "
          f"{len(list(metrics_dir.glob('*.db')))} files")
    assert status == 200
    parsed = samples(text)
    assert total(parsed, "pgfence_worker_restarts_total") == restarts
    assert total(parsed, "pgfence_jobs_completed_total") == restarts + 1
    # Gauges come out as one series each, not one per process, dead or alive.
    assert [k for k in parsed if k[0] == "pgfence_workers"] == [("pgfence_workers", ())]
    assert parsed[("pgfence_workers", ())] == 1
    assert not any("pid" in dict(labels) for _name, labels in parsed)
    # The files of live-mode gauges of dead processes are gone.
    live = {run.proc.pid, *children(run.proc.pid)}
    gauge_pids = {int(f.stem.rsplit("_", 1)[1]) for f in metrics_dir.glob("gauge_*.db")}
    assert gauge_pids <= live, gauge_pids - live


def test_systemd_notify_ready_watchdog_stopping_in_order(dsn, tmp_path):
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.2)
    port = free_port()
    proc = spawn("run", "--workers", "2", "--lease", "3", "--metrics-port", str(port), "--graceful-timeout", "7",
                 env=env_for(dsn, NOTIFY_SOCKET=address, WATCHDOG_USEC="2000000"),
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    messages: list[str] = []

    def receive() -> None:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            pass

    try:
        wait_for(lambda: receive() or sum(m.startswith("WATCHDOG=1") for m in messages) >= 2, timeout=30,
                 message="READY then two WATCHDOGs")
        ready_at = next(i for i, m in enumerate(messages) if "READY=1" in m.splitlines())
        assert ready_at == 0, messages
        assert messages[0].splitlines()[1].startswith("STATUS=2 workers up")
        # READY comes once the workers are up: /readyz agrees.
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: receive() or any(m.startswith("STOPPING=1") for m in messages), timeout=15)
        assert proc.wait(timeout=30) == 0
        while True:   # drain what is left
            before = len(messages)
            receive()
            if len(messages) == before:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    kinds = [m.splitlines()[0] for m in messages]
    stopping = kinds.index("STOPPING=1")
    assert kinds[0] == "READY=1" and kinds.count("READY=1") == 1
    assert set(kinds[1:stopping]) == {"WATCHDOG=1"}
    assert kinds[stopping + 1:] == [], "nothing after STOPPING=1"
    lines = messages[stopping].splitlines()
    extend = int(lines[1].split("=", 1)[1])
    assert lines[1].startswith("EXTEND_TIMEOUT_USEC=") and 7e6 < extend <= 22e6


def test_a_scrape_skips_an_empty_or_half_written_metrics_file_with_one_line(backend, dsn, conn, runs, tmp_path):
    run, metrics_dir = one_worker_with_metrics_dir(backend, dsn, conn, runs, tmp_path)
    # A child that has just created its file (nothing written yet), and one
    # that died mid-write: its header claims more bytes than follow.
    (metrics_dir / "counter_999991.db").write_bytes(b"")
    (metrics_dir / "histogram_999992.db").write_bytes((64).to_bytes(4, "little") + b"\0" * 4 + b"\x30\0\0\0{\"x")
    for _ in range(3):
        parsed = run.scrape()
        assert total(parsed, "pgfence_jobs_completed_total") == 1
        assert total(parsed, "pgfence_jobs_claimed_total") == 1
    err = run.stop()
    assert "Traceback" not in err, err
    # The half-written one is logged once; the empty one (a child that has
    # just started: the race every start has) is skipped silently.
    skipped = [line for line in err.splitlines() if "skipped, it cannot be read" in line]
    assert len(skipped) == 1 and "histogram_999992.db" in skipped[0], err
    assert "counter_999991.db" not in err, err
