"""Child recycling in ``pgfence run``: ``--max-jobs-per-child`` and
``--max-memory-per-child``.

A child that reaches its limit finishes what it holds and exits; the arbiter
starts a fresh one in its place.  The acceptance tests run real arbiters
against a real PostgreSQL and read the job rows, the effect rows and the log;
the limit's jitter is pure logic, tested without a database.
"""

from __future__ import annotations

import random
import re

from pgtools import env_for, job_row, pgfence, scalar, wait_for
from pgfence.prefork.child import RECYCLED, recycle_limit, rss_mib
from test_supervisor import counts, done_count, final_stats, problems, runs, write_module  # noqa: F401

LEASE = 1.5

ARBITER_RECYCLED = re.compile(r"worker (\d+) \(pid (\d+)\) recycled: starting a fresh worker in its place")


# -- the limit's jitter, without a database ------------------------------------------


def test_each_child_draws_its_job_limit_between_n_and_n_plus_a_tenth():
    drawn = {recycle_limit(100, random.Random(seed)) for seed in range(500)}
    assert drawn == set(range(100, 111))
    # Below ten there is no tenth to add: the limit is exactly N.
    assert {recycle_limit(5, random.Random(seed)) for seed in range(50)} == {5}
    assert {recycle_limit(1, random.Random(seed)) for seed in range(50)} == {1}
    assert 1000 <= recycle_limit(1000) <= 1100


def test_resident_memory_grows_with_what_the_process_touches():
    before = rss_mib()
    block = b"x" * (64 * 2**20)
    assert rss_mib() - before >= 60
    del block


# -- acceptance: real arbiters ------------------------------------------------------


def test_children_that_reach_max_jobs_per_child_are_replaced_and_every_job_runs_once(dsn, conn, runs):
    ids = [r[0] for r in conn.execute(
        "SELECT pgfence.enqueue('effect', '{}'::jsonb) FROM generate_series(1, 40) ORDER BY 1")]
    run = runs("--workers", "2", "--max-jobs-per-child", "5", "--lease", str(LEASE), dsn=dsn)
    wait_for(lambda: done_count(conn) == 40, timeout=60, interval=0.1, message="all 40 jobs done")
    # Each child ran at most 5 jobs, so 40 jobs took at least 8 children;
    # the last of them may still be on its way out.
    wait_for(lambda: len(ARBITER_RECYCLED.findall(run.log())) >= 7, timeout=30, message="children recycled")
    wait_for(lambda: len(run.workers()) == 2, timeout=30, message="two workers up")
    assert run.proc.poll() is None, run.log()

    assert counts(conn) == [("done", 1, 0, 40)]
    effects = conn.execute("SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY job_id").fetchall()
    assert [(job_id, attempt) for job_id, attempt, _w in effects] == [(i, 1) for i in ids]
    per_worker: dict[str, int] = {}
    for _j, _a, worker in effects:
        per_worker[worker] = per_worker.get(worker, 0) + 1
    assert len(per_worker) >= 8, per_worker
    assert max(per_worker.values()) <= 5, per_worker
    assert {int(w) for w in per_worker} <= run.worker_pids_logged()

    assert run.stop() == 0
    log = run.log()
    started, restarts, _rounds, _statements = final_stats(log)
    assert restarts == 0, log
    assert started == 2 + len(ARBITER_RECYCLED.findall(log)), log
    assert re.search(r"worker \d+ recycled after 5 jobs \(max-jobs-per-child 5, its own limit 5\)", log), log
    assert problems(log) == [], log
    assert "crashed" not in log and "in a row" not in log, log
    assert run.leftovers() == []


HOG_MODULE = """\
from pgfence import handler

#: What this process has taken, kept: a leak.
KEPT = []


@handler("hog")
def hog(job):
    # Touched bytes, so that they are resident (a zeroed bytearray may not be).
    KEPT.append(b"x" * (MIB * 2**20))
"""


def test_a_child_above_max_memory_per_child_after_its_job_is_replaced_and_the_job_runs_once(
        dsn, conn, tmp_path, runs):
    # A child's own size (the interpreter, psycopg, the handlers) is well
    # below the limit; one hog job takes it well above.
    limit, hog = 150, 200
    env = write_module(tmp_path, "pgfence_test_hog", f"MIB = {hog}\n" + HOG_MODULE)
    env["PGFENCE_DSN"] = dsn
    env["PGFENCE_HANDLERS"] = "pgfence.handlers.builtin,pgfence_test_hog"
    run = runs("--workers", "1", "--max-memory-per-child", str(limit), "--lease", str(LEASE), env=env)
    wait_for(lambda: len(run.workers()) == 1, timeout=30, message="one worker up")
    [first] = run.workers()

    # A small job: the child stays below its limit and is kept.
    noop = scalar(conn, "SELECT pgfence.enqueue('noop')")
    wait_for(lambda: job_row(conn, noop)["status"] == "done", timeout=30, message="noop done")
    assert "recycled" not in run.log()
    assert list(run.workers()) == [first]

    job_id = scalar(conn, "SELECT pgfence.enqueue('hog')")
    wait_for(lambda: ARBITER_RECYCLED.search(run.log()), timeout=30, message="child recycled")
    wait_for(lambda: len(run.workers()) == 1 and first not in run.workers(), timeout=30,
             message="a fresh worker in its place")
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"]) == ("done", 1, 0)
    assert [int(pid) for _n, pid in ARBITER_RECYCLED.findall(run.log())] == [first]
    assert re.search(rf"worker 1 recycled after 2 jobs: resident memory \d+ MiB above max-memory-per-child "
                     rf"{limit} MiB", run.log()), run.log()
    assert run.proc.poll() is None

    assert run.stop() == 0
    log = run.log()
    assert final_stats(log)[:2] == (2, 0), log
    assert problems(log) == [], log
    assert run.leftovers() == []


def test_a_non_positive_recycling_limit_is_one_line_and_exit_2(dsn, conn, tmp_path):
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    toml = tmp_path / "zero.toml"
    toml.write_text("max_memory_per_child = -5\n")
    cases = [
        (("--max-jobs-per-child", "0"), {}, "invalid max-jobs-per-child: ", " 0"),
        ((), {"PGFENCE_MAX_JOBS_PER_CHILD": "-1"}, "invalid max-jobs-per-child: ", " -1"),
        (("--max-memory-per-child", "0"), {}, "invalid max-memory-per-child: ", " 0"),
        (("--max-memory-per-child", "lots"), {}, "invalid max-memory-per-child: ", " 'lots'"),
        (("--config", str(toml)), {}, "invalid max-memory-per-child: ", " -5"),
    ]
    for args, extra, start, end in cases:
        result = pgfence("run", *args, env=env_for(dsn, **extra), timeout=30)
        assert (result.returncode, result.stdout) == (2, ""), (args, extra, result)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, extra, result.stderr)
        assert lines[0].startswith("pgfence: error: " + start) and lines[0].endswith(end), lines
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"]) == ("queued", 0)
    assert RECYCLED not in (0, 1, 2, 3)   # distinct from a clean exit, a crash, usage and a boot error
