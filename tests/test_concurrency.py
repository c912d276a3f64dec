"""Many jobs per worker child: ``--threads`` and ``--async-concurrency``
under ``pgfence run``, with real processes, real signals, real PostgreSQL.

Every test reads the job rows and the effect rows (one per completed
attempt, naming the child's pid: two rows for one job would be a double
run), the arbiter's log and, where the contract names one, the metric.

The handlers live in tests/concurrency_handlers.py (sync kinds only, so a
child that loads it alone has no event loop and a capacity of its thread
count), tests/concurrency_async_handlers.py (async kinds only) and
tests/concurrency_mixed_handlers.py (both); ``async_effect`` is pgfence's
built-in async kind (``pgfence.handlers.aio``, which imports the sync
built-ins too).  A claim's size is read from the rows: jobs claimed
together share their child and their ``started_at``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest

from metricstools import free_port, http_get, samples, total
from pgtools import job_row, scalar, wait_for
from pgfence import enqueue
from test_supervisor import final_stats, problems
from test_supervisor_faults import Supervisor, pid_of, state, supervisors  # noqa: F401 - the fixture

SYNC = "concurrency_handlers"
ASYNC = "concurrency_async_handlers"
MIXED = "concurrency_mixed_handlers"
#: pgfence's async built-ins (async_effect, async_sleep); loading them starts
#: an event loop in every child.
AIO = "pgfence.handlers.aio"

#: The lease of the throughput runs; the heartbeat renews a lease once a
#: third of it has passed.
LEASE = 1.5
INTERVAL = LEASE / 3

#: A child's title while it runs jobs: ``pgfence worker 3 [5/32 jobs] kind
#: job 42 attempt 1`` (the job it started last), or ``[0/32 jobs] idle``.
TITLE = re.compile(r"^pgfence worker (\d+) \[(\d+)/(\d+) jobs\] (?:idle|(\S+) job (\d+) attempt (\d+))$")


# -- helpers -------------------------------------------------------------------------


def start(supervisors, **options: Any) -> tuple[Supervisor, int]:
    """A supervisor with a metrics port of its own; (supervisor, port)."""
    port = free_port()
    return supervisors(metrics_port=port, **options), port


def scrape(port: int) -> dict:
    """The parsed /metrics, or {} while the server is not up (for polling)."""
    status, text = http_get(f"http://127.0.0.1:{port}/metrics")
    return samples(text) if status == 200 else {}


def metric(port: int, name: str, **labels: str) -> float:
    parsed = wait_for(lambda: scrape(port), timeout=10, message="a scrape of /metrics")
    return total(parsed, name, **labels)


def enqueue_many(conn, kind: str, n: int, payload: str = "{}") -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pgfence.enqueue(%s, %s::jsonb) FROM generate_series(1, %s) ORDER BY 1", (kind, payload, n))]


def rows(conn, ids: list[int]) -> list[tuple]:
    """(id, status, attempt, reclaims, locked_by) of the jobs, by id."""
    return conn.execute("SELECT id, status, attempt, reclaims, locked_by FROM pgfence.all_jobs WHERE id = ANY(%s)"
                        " ORDER BY id", (ids,)).fetchall()


def done(conn, ids: list[int]) -> bool:
    return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s) AND status = 'done'", (ids,)) == len(ids)


def effects(conn) -> list[tuple[int, int, int]]:
    """(job_id, attempt, pid) of every effect row, by job and attempt."""
    return [(j, a, int(w)) for j, a, w in conn.execute(
        "SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY job_id, attempt, id")]


def largest_claim(conn) -> int:
    """The most jobs one claim statement took: jobs claimed together share
    their child and their started_at (the statement's now())."""
    return scalar(conn, "SELECT max(n) FROM (SELECT count(*) AS n FROM pgfence.all_jobs j"
                        " JOIN pgfence_examples.effects e ON e.job_id = j.id AND e.attempt = j.attempt"
                        " GROUP BY e.worker, j.started_at) c")


def running_by(conn) -> dict[int, int]:
    """pid of the child -> jobs it holds (running)."""
    return {pid_of(w): n for w, n in conn.execute(
        "SELECT locked_by, count(*)::int FROM pgfence.all_jobs WHERE status = 'running' GROUP BY 1")}


def held_by(conn, ids: list[int], pid: int) -> bool:
    """True when every job of ``ids`` runs, attempt 1, in the child ``pid``."""
    return all(s == "running" and a == 1 and pid_of(w) == pid for _i, s, a, _r, w in rows(conn, ids))


def idle_in_transaction(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid() AND state = 'idle in transaction'")


def showing(sup: Supervisor, pid: int, jobs: int) -> bool:
    """True when the title of the child ``pid`` counts ``jobs`` jobs."""
    match = TITLE.match(sup.workers().get(pid, ""))
    return bool(match) and int(match.group(2)) == jobs


def poll(sup: Supervisor, condition, timeout: float, message: str, interval: float) -> Any:
    """Supervisor.wait at a slower pace (for conditions that cost a scrape)."""
    try:
        return wait_for(condition, timeout=timeout, interval=interval, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- {sup.label} log ---\n{sup.log()}") from None


def stop(sup: Supervisor, timeout: float = 20) -> str:
    """SIGTERM; exit 0; the log."""
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout) == 0, sup.log()
    return sup.log()


# -- 1. thousands of jobs, exactly once, one renewal statement per round -----------------


@pytest.mark.parametrize("kind, options", [
    ("c_effect", {"threads": 16, "handlers": SYNC}),
    ("c_async_effect", {"async_concurrency": 200, "handlers": ASYNC}),
    ("async_effect", {"async_concurrency": 200, "handlers": AIO}),
], ids=["2x16-threads", "2x200-async", "2x200-async-builtin"])
def test_thousands_of_jobs_run_exactly_once_with_one_renewal_statement_per_round(
        dsn, conn, supervisors, kind, options):
    """5,000 jobs of 10 ms, one in fifty of 1 s (those live past a third of
    the 1.5 s lease, so they are renewed while the short ones churn), on two
    children of 16 threads, then of 200 async slots (an async-only module,
    then pgfence.handlers.aio, whose module brings the sync built-ins
    along): every job done once on attempt 1 with one effect row, many jobs
    in flight, a first claim that fills the slots, and the heartbeat sending
    at most one statement per round, about one per interval, many leases
    each."""
    n = 5000
    ids = [r[0] for r in conn.execute(
        "SELECT pgfence.enqueue(%s, CASE WHEN i %% 50 = 0 THEN '{\"seconds\": 1.0}'::jsonb"
        "                                ELSE '{\"seconds\": 0.01}'::jsonb END)"
        " FROM generate_series(1, %s) AS i ORDER BY 1", (kind, n))]
    assert len(ids) == n
    began = time.monotonic()
    sup, port = start(supervisors, workers=2, lease=LEASE, **options)
    seen = {"leases": 0.0, "in_flight": 0.0}

    def finished() -> bool:
        parsed = scrape(port)
        seen["leases"] = max(seen["leases"], total(parsed, "pgfence_heartbeat_leases"))
        seen["in_flight"] = max(seen["in_flight"], total(parsed, "pgfence_jobs_in_flight"))
        return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'done'") == n

    poll(sup, finished, 60, f"all {n} jobs done", interval=0.25)
    children = set(sup.workers())
    log = stop(sup)
    elapsed = time.monotonic() - began

    retried = conn.execute("SELECT attempt, reclaims, last_error, count(*)::int FROM pgfence.all_jobs WHERE attempt > 1"
                           " GROUP BY 1, 2, 3").fetchall()
    assert conn.execute("SELECT status, attempt, reclaims, count(*)::int FROM pgfence.all_jobs GROUP BY 1, 2, 3"
                        ).fetchall() == [("done", 1, 0, n)], (retried, problems(log))
    made = effects(conn)
    assert [(j, a) for j, a, _p in made] == [(i, 1) for i in ids]
    assert {p for _j, _a, p in made} == children and len(children) == 2
    capacity = 2 * (options.get("threads", 1) + (options.get("async_concurrency", 0)))
    # Many at once, never more than the capacity.
    assert 16 <= seen["in_flight"] <= capacity, seen
    # Claims sized to the free slots: a child's first claim, into its empty
    # threads or loop, takes as many jobs as they have slots.
    slots = options.get("threads") or options["async_concurrency"]
    assert largest_claim(conn) == slots, largest_claim(conn)
    # Many leases went in one renewal statement.
    assert seen["leases"] >= 16, seen
    started, restarts, rounds, statements = final_stats(log)
    assert (started, restarts) == (2, 0), log
    # At most one statement a round, and at most one per interval however
    # many jobs are in flight: a statement comes no sooner than one
    # interval after the previous one, unless a lease would otherwise come
    # within an interval of its deadline (one published more than an
    # interval after its claim was sent: a loaded machine).  Counted over
    # the supervisor's whole life, which holds the heartbeat's: one for the
    # first statement, one for such a lease.  Rounds themselves may come
    # more often (one is also planned for a lease's timeout), but one that
    # finds nothing due sends nothing.  The 100 long jobs were each renewed
    # at least once: in fewer statements than leases.
    assert 1 <= statements <= rounds, log
    assert statements <= elapsed / INTERVAL + 2, (statements, elapsed)
    assert statements < n // 50, log
    assert problems(log) == [], log


# -- 2. a child holding 16 jobs, stopped or killed -------------------------------------------


def test_sigstopped_child_with_16_jobs_loses_all_16_and_none_of_its_completions_commits(dsn, conn, supervisors):
    """One child of 16 threads holds 16 jobs, each inside its fenced
    transaction with its effect written, and is stopped.  A second child
    reclaims all 16 once their 1.5 s leases run out (attempt 2) and
    completes them.  Resumed, the stopped child's 16 commits meet the fence:
    none commits, and double_run_prevented rises by exactly 16."""
    sup, port = start(supervisors, workers=1, threads=16, handlers=SYNC, lost_lease_kill_after=60)
    [p] = sup.wait_workers(1)
    before = metric(port, "pgfence_double_run_prevented_total")
    ids = enqueue_many(conn, "c_hold", 16, '{"seconds": 6}')
    sup.wait(lambda: held_by(conn, ids, p), 20, "the 16 jobs running in the one child")
    sup.wait(lambda: idle_in_transaction(conn) == 16, 10, "the 16 inside their fenced transactions")
    sup.wait(lambda: showing(sup, p, 16), 10, "the 16 jobs in the child's title")
    sup.signal(signal.SIGTTIN)
    [q] = set(sup.wait_workers(2)) - {p}

    os.kill(p, signal.SIGSTOP)
    sup.wait(lambda: done(conn, ids), 20, "the other child's reclaims and completions")
    assert rows(conn, ids) == [(i, "done", 2, 1, None) for i in ids]
    assert state(p) == "T" and p in sup.workers()     # still stopped, not killed

    os.kill(p, signal.SIGCONT)
    sup.wait(lambda: metric(port, "pgfence_double_run_prevented_total") >= before + 16, 20,
             "the 16 stale completions rejected")
    sup.wait(lambda: idle_in_transaction(conn) == 0, 10, "the stale transactions over")
    sup.wait(lambda: TITLE.match(sup.workers().get(p, "")) and sup.workers()[p].endswith(" idle"), 10,
             "the resumed child idle again")
    assert metric(port, "pgfence_double_run_prevented_total") == before + 16
    assert metric(port, "pgfence_double_run_prevented_total", kind="c_hold") == 16
    assert effects(conn) == [(i, 2, q) for i in ids]
    assert rows(conn, ids) == [(i, "done", 2, 1, None) for i in ids]
    log = sup.log()
    rejected = re.findall(r"job (\d+) attempt 1 lost its lease \(fence_rejected\)", log)
    assert sorted(map(int, rejected)) == ids, log
    assert "killing it" not in log, log
    assert set(sup.workers()) == {p, q}
    stop(sup)


def test_sigkilled_child_with_16_jobs_has_all_16_released_at_once(dsn, conn, supervisors):
    """A child of 16 threads killed while it holds 16 jobs: the arbiter
    releases the 16 on its death, long before their 30 s leases would run
    out; its replacement runs them (attempt 2, no reclaim counted)."""
    sup = supervisors(workers=1, threads=16, lease=30, handlers=SYNC)
    [p] = sup.wait_workers(1)
    ids = enqueue_many(conn, "c_first_slow", 16, '{"seconds": 60}')
    sup.wait(lambda: held_by(conn, ids, p), 20, "the 16 jobs running in the one child")
    # The claim commits before the child publishes the jobs in its slot; its
    # title counts them once they are.
    sup.wait(lambda: showing(sup, p, 16), 10, "the 16 jobs in the child's title")
    os.kill(p, signal.SIGKILL)
    killed = time.monotonic()
    sup.wait(lambda: not any(pid_of(w) == p for *_x, w in rows(conn, ids)), 10, "the 16 released")
    sup.wait(lambda: done(conn, ids), 15, "the 16 done by the replacement")
    # Well before their 30 s leases would have run out.
    assert time.monotonic() - killed < 15
    [q] = sup.workers()
    assert q != p
    # Released on the child's death: counted as a reclaim, reported as such.
    assert rows(conn, ids) == [(i, "done", 2, 1, None) for i in ids]
    assert {job_row(conn, i)["last_error"] for i in ids} == {"worker died"}
    assert effects(conn) == [(i, 2, q) for i in ids]
    log = sup.log()
    assert re.search(rf"worker \d+ \(pid {p}\) killed by SIGKILL holding 16 job\(s\): releasing them", log), log
    stop(sup)


# -- 3. one thread hung past its timeout -------------------------------------------------------


def test_a_thread_hung_past_its_timeout_recycles_its_child_after_the_others_finish(dsn, conn, supervisors):
    """A child of 4 threads runs one job that hangs past its 1 s timeout,
    never calling check(), and three 3 s jobs.  lost-lease-kill-after (1 s)
    after the timeout the child releases the hung job (fenced, retried),
    claims no more, finishes the other three (done, attempt 1) and exits as
    RECYCLED (4): no crash, no kill.  A fresh child runs the hung job's
    attempt 2; children_recycled_total{reason="timeout"} is 1."""
    sup, port = start(supervisors, workers=1, threads=4, handlers=SYNC, lost_lease_kill_after=1,
                      backoff_base=0.2, graceful_timeout=15)
    [p] = sup.wait_workers(1)
    hung = enqueue(conn, "c_hang", {"seconds": 60}, max_attempts=3)
    others = [enqueue(conn, "c_effect", {"seconds": 3}) for _ in range(3)]
    sup.wait(lambda: held_by(conn, [hung, *others], p), 20, "the four jobs running in the one child")

    sup.wait(lambda: job_row(conn, hung)["attempt"] == 2 and job_row(conn, hung)["status"] == "done", 20,
             "the hung job's attempt 2 done")
    row = job_row(conn, hung)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "done", 2, 0, None, "timed out after 1s; worker recycled")
    assert rows(conn, others) == [(i, "done", 1, 0, None) for i in others]
    assert all(job_row(conn, i)["last_error"] is None for i in others)
    [q] = sup.wait_workers(1)
    assert q != p and not sup.alive(p)
    assert effects(conn) == sorted([(i, 1, p) for i in others] + [(hung, 2, q)])
    log = sup.log()
    assert re.search(rf"worker \d+ \(pid {p}\) recycled: starting a fresh worker in its place", log), log
    assert metric(port, "pgfence_children_recycled_total", reason="timeout") == 1
    assert "killing it" not in log and "crashed" not in log, log
    log = stop(sup)
    assert final_stats(log)[:2] == (2, 0), log


# -- 4. recycling children of 8 threads ---------------------------------------------------------

RECYCLED_LINE = re.compile(r"worker (\d+) \(pid (\d+)\) recycled: starting a fresh worker in its place")


def test_max_jobs_per_child_with_8_threads_loses_and_doubles_no_job(dsn, conn, supervisors):
    """Two children of 8 threads, each replaced after 20 jobs (20 to 22
    with its jitter), run 200 jobs: each once, on attempt 1; no child ran
    more than its limit; no crash, no crash-loop delay."""
    sup, port = start(supervisors, workers=2, threads=8, lease=LEASE, handlers=SYNC, max_jobs_per_child=20)
    ids = enqueue_many(conn, "c_effect", 200, '{"seconds": 0.02}')
    sup.wait(lambda: done(conn, ids), 60, "the 200 jobs done")
    sup.wait(lambda: len(sup.workers()) == 2, 20, "two children up")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    made = effects(conn)
    assert [(j, a) for j, a, _p in made] == [(i, 1) for i in ids]
    per_child: dict[int, int] = {}
    for _j, _a, pid in made:
        per_child[pid] = per_child.get(pid, 0) + 1
    assert max(per_child.values()) <= 22, per_child
    assert len(per_child) >= 200 // 22, per_child
    recycled = metric(port, "pgfence_children_recycled_total", reason="max_jobs")
    log = sup.log()
    assert recycled == len(RECYCLED_LINE.findall(log)) >= len(per_child) - 2, log
    log = stop(sup)
    assert final_stats(log)[1] == 0, log
    assert "crashed" not in log and "in a row" not in log, log
    assert problems(log) == [], log


def test_max_memory_per_child_with_8_threads_loses_and_doubles_no_job(dsn, conn, supervisors):
    """A child of 8 threads whose jobs keep 40 MiB each goes above 150 MiB:
    it finishes what it holds and is replaced; every job runs once, on
    attempt 1, and no crash is counted."""
    sup, port = start(supervisors, workers=1, threads=8, lease=LEASE, handlers=SYNC, max_memory_per_child=150)
    [first] = sup.wait_workers(1)
    hogs = enqueue_many(conn, "c_hog", 6, '{"mib": 40}')
    light = enqueue_many(conn, "c_effect", 40, '{"seconds": 0.05}')
    ids = sorted(hogs + light)
    sup.wait(lambda: done(conn, ids), 60, "the 46 jobs done")
    sup.wait(lambda: RECYCLED_LINE.search(sup.log()), 20, "a child recycled")
    sup.wait(lambda: len(sup.workers()) == 1 and first not in sup.workers(), 20, "a fresh child in its place")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert [(j, a) for j, a, _p in effects(conn)] == [(i, 1) for i in ids]
    log = sup.log()
    assert first in {int(pid) for _n, pid in RECYCLED_LINE.findall(log)}
    assert re.search(r"worker \d+ recycled after \d+ jobs: resident memory \d+ MiB above max-memory-per-child "
                     r"150 MiB", log), log
    assert metric(port, "pgfence_children_recycled_total", reason="max_memory") == len(RECYCLED_LINE.findall(log))
    log = stop(sup)
    assert final_stats(log)[1] == 0, log
    assert "crashed" not in log and "in a row" not in log, log
    assert problems(log) == [], log


# -- 5. a handler that blocks the event loop -----------------------------------------------------


@pytest.mark.parametrize("kill_after, error, recycled", [
    (None, "timed out after 1s", 0),
    (0.5, "timed out after 1s; worker recycled", 1),
], ids=["cancelled-at-timeout", "given-up-and-recycled"])
def test_an_async_handler_blocking_the_event_loop_is_named_and_times_out(dsn, conn, supervisors, kill_after,
                                                                          error, recycled):
    """time.sleep(2) inside async def, with a 1 s timeout: a WARNING names
    the kind and the job, event_loop_blocked_total{kind} counts it, and the
    attempt is not completed: it ends timed out and retried (done on
    attempt 2, which does not block).  With the default
    lost-lease-kill-after (5 s) the handler returns before it would be given
    up: its cancel at the timeout could not reach it, and it is reported
    timed out all the same.  With 0.5 s it is given up while it still holds
    the loop, and its child recycled."""
    sup, port = start(supervisors, workers=1, handlers=MIXED, lost_lease_kill_after=kill_after, backoff_base=0.2)
    [p] = sup.wait_workers(1)
    job_id = enqueue(conn, "c_block_loop", {}, max_attempts=3)
    sup.wait(lambda: job_row(conn, job_id)["status"] == "done", 20, "the job done")
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "done", 2, 0, None, error), sup.log()
    log = sup.log()
    found = re.findall(rf" WARNING .*event loop of worker \S+ blocked for (\d+(?:\.\d+)?)s (?:\(and counting\) )?"
                       rf"by c_block_loop job {job_id} attempt 1\b", log)
    assert len(found) == 1 and float(found[0]) >= 1.0, log
    assert metric(port, "pgfence_event_loop_blocked_total", kind="c_block_loop") == 1
    assert metric(port, "pgfence_children_recycled_total", reason="timeout") == recycled
    assert bool(RECYCLED_LINE.search(log)) == bool(recycled), log
    assert sup.alive(p) != bool(recycled)
    assert "killing it" not in log and "crashed" not in log, log
    stop(sup)


# -- 6. claims sized to the free slots ------------------------------------------------------------


@pytest.mark.parametrize("handlers", [SYNC, f"{AIO},{SYNC}"], ids=["sync-only", "with-async-kinds"])
def test_claims_take_no_more_than_the_free_threads(dsn, conn, supervisors, handlers):
    """Two children of 4 threads and twelve 3 s jobs: eight run at once, four
    in each child, and no child ever holds more than 4 (the last four wait
    in the queue, not in a child).  Also with async kinds loaded, whose
    event loop adds async slots: sync jobs still wait for a free thread in
    the queue."""
    sup, port = start(supervisors, workers=2, threads=4, handlers=handlers)
    sup.wait_workers(2)
    ids = enqueue_many(conn, "c_effect", 12, '{"seconds": 3}')
    most: dict[int, int] = {}
    shown = capacity_shown(handlers)

    def eight_running() -> bool:
        held = running_by(conn)
        for pid, n in held.items():
            most[pid] = max(most.get(pid, 0), n)
        return sorted(held.values()) == [4, 4]

    sup.wait(eight_running, 20, "eight jobs running, four in each child")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s) AND status = 'queued'", (ids,)) == 4

    # A child retitles itself and sets its gauges as it hands each claimed
    # job to a thread, just after its claim commits.
    def titled() -> bool:
        eight_running()
        titles = list(sup.workers().values())
        return len(titles) == 2 and all((m := TITLE.match(t)) and m.group(2, 3, 4) == ("4", shown, "c_effect")
                                        for t in titles)

    sup.wait(titled, 5, f"both titles showing [4/{shown} jobs]")

    def gauges() -> dict:
        eight_running()
        parsed = scrape(port)
        return total(parsed, "pgfence_jobs_in_flight") == 8 and parsed

    parsed = sup.wait(gauges, 5, "8 jobs in flight in the gauges")
    assert total(parsed, "pgfence_worker_capacity") == 2 * int(shown), parsed
    assert total(parsed, "pgfence_worker_free_slots") == 2 * int(shown) - 8, parsed

    def all_done() -> bool:
        eight_running()
        return done(conn, ids)

    sup.wait(all_done, 30, "the twelve jobs done")
    assert max(most.values()) == 4 and len(most) == 2, most
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert [(j, a) for j, a, _p in effects(conn)] == [(i, 1) for i in ids]
    stop(sup)


@pytest.mark.parametrize("handlers", [ASYNC, AIO], ids=["async-only", "with-sync-kinds"])
def test_async_claims_are_sized_to_the_loops_free_slots(dsn, conn, supervisors, handlers):
    """One child, one thread, 200 async slots, 400 async jobs of 0.5 s: the
    first claim fills the loop (about 200 at once), also when sync kinds are
    loaded too (pgfence.handlers.aio imports the sync built-ins), though the
    one thread is free all along."""
    kind = "c_async_effect" if handlers == ASYNC else "async_effect"
    sup = supervisors(workers=1, async_concurrency=200, handlers=handlers)
    sup.wait_workers(1)
    ids = enqueue_many(conn, kind, 400, '{"seconds": 0.5}')
    most = [0]

    def all_done() -> bool:
        most[0] = max(most[0], sum(running_by(conn).values()))
        return done(conn, ids)

    sup.wait(all_done, 30, "the 400 jobs done")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert [(j, a) for j, a, _p in effects(conn)] == [(i, 1) for i in ids]
    # The first claim fills the free loop (200 slots, the thread's one
    # slot aside); later ones take what ended meanwhile.
    assert largest_claim(conn) >= 199, largest_claim(conn)
    assert most[0] >= 199, most
    stop(sup)


def test_async_jobs_queueing_for_the_loops_connections_are_not_failed_as_an_outage(dsn, conn, supervisors):
    """One child, 200 async slots, a 1.5 s lease, and 200 jobs whose fenced
    block holds a connection 0.2 s: they queue for the loop pool's few
    connections, some longer than a second.  The database is up all along:
    every job is done on attempt 1, none reported 'database unreachable'."""
    sup = supervisors(workers=1, async_concurrency=200, lease=LEASE, handlers=ASYNC)
    sup.wait_workers(1)
    ids = enqueue_many(conn, "c_async_slow_write", 200, '{"seconds": 0.2}')
    sup.wait(lambda: scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = ANY(%s) AND (status = 'done'"
                                  " OR last_error IS NOT NULL)", (ids,)) == len(ids), 60, "the 200 jobs ended")
    errors = conn.execute("SELECT last_error, count(*)::int FROM pgfence.all_jobs WHERE last_error IS NOT NULL"
                          " GROUP BY 1").fetchall()
    assert errors == [], errors
    sup.wait(lambda: done(conn, ids), 30, "the 200 jobs done")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert [(j, a) for j, a, _p in effects(conn)] == [(i, 1) for i in ids]
    stop(sup)


def capacity_shown(handlers: str) -> str:
    """A child's capacity: its threads, plus the async slots when a module
    registers an async kind (pgfence.handlers.aio does)."""
    return "4" if handlers == SYNC else str(4 + 100)


# -- 7. sync and async kinds in one child -----------------------------------------------------------


def test_an_async_only_child_claims_completes_and_wakes_on_its_loop(dsn, conn, supervisors):
    """A child whose handlers are all async claims and completes on its
    event loop: 600 jobs of 20 ms that write nothing, on 50 slots, all done
    once on attempt 1 and completed in batches (fewer completion statements,
    each its own now(), than jobs); once idle, a job enqueued later is
    picked up on its NOTIFY, not at the next poll (poll interval 60 s); and
    SIGTERM with 20 such jobs in flight lets them end and completes them
    before exit 0."""
    sup = supervisors(workers=1, async_concurrency=50, handlers=ASYNC, poll_interval=60)
    [p] = sup.wait_workers(1)
    ids = enqueue_many(conn, "c_async_wait", 600, '{"seconds": 0.02}')
    sup.wait(lambda: done(conn, ids), 60, "the 600 jobs done")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    completions = scalar(conn, "SELECT count(DISTINCT finished_at) FROM pgfence.all_jobs WHERE id = ANY(%s)", (ids,))
    assert completions < len(ids), completions
    sup.wait(lambda: showing(sup, p, 0), 10, "the child idle")
    [late] = enqueue_many(conn, "c_async_wait", 1)
    sup.wait(lambda: done(conn, [late]), 20, "the job enqueued while the child idled done")
    assert rows(conn, [late]) == [(late, "done", 1, 0, None)]
    last = enqueue_many(conn, "c_async_wait", 20, '{"seconds": 2}')
    sup.wait(lambda: held_by(conn, last, p), 20, "the 20 jobs running in the one child")
    stop(sup)
    assert rows(conn, last) == [(i, "done", 1, 0, None) for i in last]


def test_a_mixed_module_runs_its_sync_and_async_kinds_at_once_in_one_child(dsn, conn, supervisors):
    """Each meeting handler finishes only once the other has started in the
    same process (tests/concurrency_mixed_handlers.py): both done on attempt
    1 in the one child means they ran at the same time there."""
    sup = supervisors(workers=1, threads=2, handlers=MIXED)
    [p] = sup.wait_workers(1)
    ids = [enqueue(conn, "c_meet_sync", {}, max_attempts=1), enqueue(conn, "c_meet_async", {}, max_attempts=1)]
    sup.wait(lambda: all(job_row(conn, i)["status"] in ("done", "failed") for i in ids), 20, "both jobs ended")
    assert [(r["status"], r["attempt"], r["last_error"]) for r in map(lambda i: job_row(conn, i), ids)] == [
        ("done", 1, None)] * 2
    assert effects(conn) == [(ids[0], 1, p), (ids[1], 1, p)]
    stop(sup)


@pytest.mark.parametrize("kind, full", [("c_async_wait", "loop"), ("c_pause", "threads")])
def test_a_mixed_child_fills_the_slots_that_free_up_on_its_full_side_before_the_poll_interval(
        dsn, conn, supervisors, kind, full):
    """A child with def and async def handlers, 2 threads and 4 loop slots,
    poll interval 60 s: 12 jobs of one side only.  Its first claim fills
    that side; the other side's claim then finds nothing and the child
    idles, yet the first side's slots, as they free up, take the queued
    jobs at once (no NOTIFY comes: all 12 were enqueued at once), so all
    12 are done on attempt 1 long before the poll interval."""
    sup = supervisors(workers=1, threads=2, async_concurrency=4, handlers=f"{SYNC},{ASYNC}", poll_interval=60,
                      lease=120)
    sup.wait_workers(1)
    ids = enqueue_many(conn, kind, 12, '{"seconds": 0.3}')
    sup.wait(lambda: done(conn, ids), 20, f"the 12 jobs of the {full} done before the poll interval")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    stop(sup)


# -- 8. draining many jobs on SIGTERM and SIGHUP -------------------------------------------------------


@pytest.mark.parametrize("kind, options", [
    ("c_effect", {"threads": 8, "handlers": SYNC}),
    ("async_effect", {"handlers": AIO}),
], ids=["8-threads", "async"])
def test_sigterm_drains_every_job_in_flight_before_exit_0(dsn, conn, supervisors, kind, options):
    sup = supervisors(workers=1, graceful_timeout=30, **options)
    [p] = sup.wait_workers(1)
    ids = enqueue_many(conn, kind, 8, '{"seconds": 3}')
    sup.wait(lambda: held_by(conn, ids, p), 20, "the eight jobs running in the one child")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(20) == 0, sup.log()
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert effects(conn) == [(i, 1, p) for i in ids]
    log = sup.log()
    assert "killing it" not in log and "lost its lease" not in log, log
    assert not sup.alive(p)


def test_sighup_lets_the_old_child_finish_its_eight_jobs(dsn, conn, supervisors):
    sup = supervisors(workers=1, threads=8, handlers=SYNC)
    [p] = sup.wait_workers(1)
    ids = enqueue_many(conn, "c_effect", 8, '{"seconds": 3}')
    sup.wait(lambda: held_by(conn, ids, p), 20, "the eight jobs running in the one child")
    sup.signal(signal.SIGHUP)
    [q] = sup.wait(lambda: len(w := sup.workers()) == 1 and p not in w and list(w), 20,
                   "the new child in place of the old one")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]     # the old one finished first
    assert effects(conn) == [(i, 1, p) for i in ids]
    # The new child works.
    more = enqueue(conn, "c_effect", {})
    sup.wait(lambda: job_row(conn, more)["status"] == "done", 10, "a job done by the new child")
    assert effects(conn)[-1] == (more, 1, q)
    log = stop(sup)
    assert "lost its lease" not in log and "killing it" not in log, log


# -- 7. jobs that write nothing, ending faster than they are completed ----------------------


def test_short_jobs_that_write_nothing_never_overfill_the_childs_lease_table(dsn, conn, supervisors):
    """One child of 8 threads runs 3,000 jobs of 5 ms that write nothing, so
    each is completed by the completer's batched statement while the
    claiming thread claims on.  Jobs being completed still hold their
    leases (and their entries in the child's part of the slot table, room
    for twice the capacity): the claims must count them until their
    completion untracked them.  Before, a batch was forgotten by the claims
    the moment the completer took it, the child claimed past the table and
    crashed ('IndexError: pop from empty list') holding its jobs, which were
    released as reclaims and run again."""
    n = 3000
    ids = enqueue_many(conn, "c_pause", n, '{"seconds": 0.005}')
    sup = supervisors(workers=1, threads=8, lease=LEASE, handlers=SYNC)
    sup.wait(lambda: done(conn, ids), 90, f"all {n} jobs done")
    log = stop(sup)
    assert conn.execute("SELECT status, attempt, reclaims, count(*)::int FROM pgfence.all_jobs GROUP BY 1, 2, 3"
                        ).fetchall() == [("done", 1, 0, n)], problems(log)
    assert "crashed" not in log, log
    started, restarts, _rounds, _statements = final_stats(log)
    assert (started, restarts) == (1, 0), log
    assert problems(log) == [], log


# -- 8. a stopped child is not a blocked event loop ---------------------------------------------


def test_a_stopped_child_is_not_reported_as_a_blocked_event_loop(dsn, conn, supervisors):
    """A child with an event loop, running 200 async jobs and 2 threaded ones,
    stopped (SIGSTOP) five times for 1.5 s, resumed each time: its loop
    stood still only because the whole process did.  No WARNING says the
    loop was blocked, event_loop_blocked_total stays 0, and the child's jobs
    all end on their first attempt (the load test's stop fault logged
    `event loop ... blocked for 4.9s ... by code outside any job` for the
    children it resumed, whenever the claiming thread looked at the loop
    before the loop's own first turn: on resume the loop first runs the
    timers of the jobs that fell due while it was stopped, 200 here, and
    the claiming thread gets the interpreter in between)."""
    sup, port = start(supervisors, workers=1, threads=2, async_concurrency=200, handlers=f"{SYNC},{ASYNC}",
                      lease=30)
    [p] = sup.wait_workers(1)
    ids = enqueue_many(conn, "c_async_effect", 200, '{"seconds": 12}') + enqueue_many(conn, "c_effect", 2,
                                                                                         '{"seconds": 12}')
    sup.wait(lambda: held_by(conn, ids, p), 20, "the 202 jobs running in the one child")
    for _ in range(5):
        os.kill(p, signal.SIGSTOP)
        stopped = time.monotonic()
        sup.wait(lambda: state(p) == "T", 5, "the child stopped")
        # Longer than a loop may stand still before it is reported (1 s).
        sup.wait(lambda: time.monotonic() - stopped >= 1.5, 10, "1.5 s stopped")
        os.kill(p, signal.SIGCONT)
        resumed = time.monotonic()
        sup.wait(lambda: state(p) != "T", 5, "the child running")
        # Its claiming thread looks at the loop every 50 ms.
        sup.wait(lambda: time.monotonic() - resumed >= 0.5, 10, "the child running half a second")
    sup.wait(lambda: done(conn, ids), 40, "the 202 jobs done")
    assert rows(conn, ids) == [(i, "done", 1, 0, None) for i in ids]
    assert metric(port, "pgfence_event_loop_blocked_total") == 0, sup.log()
    log = stop(sup)
    assert "blocked for" not in log, log
