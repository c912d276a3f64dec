"""Faults under the supervisor: real ``pgfence run`` processes, real signals,
real PostgreSQL.

A worker child stopped (SIGSTOP) or killed (SIGKILL) in the middle of a job,
the heartbeat manager killed, the arbiter told to stop (TERM, a second TERM,
INT), to grow or shrink (TTIN, TTOU) or to reload (HUP) while jobs run, and
jobs whose lease is lost (cancelled, timed out) in handlers that never look at
their lease.  Every test checks the rows in the database: each job ends in
its exact state, with its exact attempt and reclaim counts, and with exactly
one effect row or none.

The worker children are found as the children of the arbiter
(``/proc/PID/task/PID/children``) and told apart by their process titles
(``pgfence worker 3 effect job 42 attempt 2``, ``pgfence heartbeat [7
leases]``).  A worker's ``locked_by`` is ``host:pid:wN``, so a job row names
the child that holds it.

The ``stubborn`` handlers ignore their lease: they write their effect first,
inside their fenced transaction, then work there without ever calling
``job.check()``.  Only the fence (or a kill) can keep such a stale attempt's
write out.  The arbiter imports them from a module written to the test's tmp
folder, so the test process's own registry never holds them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import time
from pathlib import Path

import pytest

from pgtools import env_for, job_row, pgfence, scalar, state, title
from pgfence import enqueue
from supervisors import Supervisor, supervisor_fixture

__all__ = ["Supervisor", "state", "supervisors", "title"]   # imported by other test modules

HANDLERS_MODULE = "pgfence_fault_handlers"
HANDLERS_SOURCE = '''\
import os
import time

from pgfence import handler
from pgfence.handlers.tables import INSERT_EFFECT


def stubborn(job):
    """Writes its effect in its fenced transaction, then works there for
    payload.seconds without ever looking at its lease."""
    seconds = float(job.payload.get("seconds", 0))
    with job.fenced() as conn:
        conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt,
                                     "key": job.idempotency_key, "worker": str(os.getpid())})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)


handler("stubborn")(stubborn)
handler("stubborn_timeout", timeout=1)(stubborn)


@handler("short_lease", lease=1.5)
def short_lease(job):
    """Works payload.seconds, several of its 1.5 s leases, checking its lease
    all along."""
    deadline = time.monotonic() + float(job.payload.get("seconds", 0))
    while time.monotonic() < deadline:
        job.check()
        time.sleep(0.02)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except OSError:
        return None


def _record(job, key):
    """An effect row written at once (autocommit), outside the fence."""
    job.conn.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "key": key,
                                     "worker": str(os.getpid())})


@handler("overrun", lease=3, timeout=1)
def overrun(job):
    """Records its start and whether the previous attempt's process still
    runs; the first attempt then works on past its timeout without acting on
    it, recording when it was told (job.lease_lost) and why."""
    row = job.conn.execute("SELECT worker FROM pgfence_examples.effects WHERE job_id = %s AND attempt = %s"
                           " AND idempotency_key LIKE 'start:%%'", (job.id, job.attempt - 1)).fetchone()
    previous = "none" if row is None else ("alive" if _state(int(row[0])) not in (None, "Z", "X") else "dead")
    _record(job, f"start:{previous}")
    if job.attempt > 1:
        return
    began = time.monotonic()
    told = False
    while True:
        if not told and job.lease_lost:
            told = True
            _record(job, f"told:{job.lease.lost_reason}:{time.monotonic() - began:.2f}")
        time.sleep(0.02)
'''

WORKER_TITLE = re.compile(r"^pgfence worker (\d+) (idle|(\S+) job (\d+) attempt (\d+))$")


def prepare(tmp_path: Path) -> None:
    """The stubborn handlers' module, in the folder the children import from."""
    (tmp_path / f"{HANDLERS_MODULE}.py").write_text(HANDLERS_SOURCE)


#: Start ``pgfence run`` on the test's database with the stubborn handlers;
#: every arbiter and child is killed afterwards, and none may be left.
supervisors = supervisor_fixture(
    defaults={"workers": 2, "lease": 30, "poll_interval": 0.2,
              "handlers": f"pgfence.handlers.builtin,{HANDLERS_MODULE}"},
    prepare=prepare)


# -- the database ---------------------------------------------------------------


def pid_of(locked_by: str | None) -> int | None:
    """The pid in a supervised worker's name ``host:pid:wN:instance``."""
    return int(locked_by.split(":")[1]) if locked_by else None


def holder(conn, job_id: int) -> tuple[int, int] | None:
    """(attempt, pid of the child) while the job runs, else None."""
    row = job_row(conn, job_id)
    return (row["attempt"], pid_of(row["locked_by"])) if row["status"] == "running" else None


def summary(conn, job_id: int) -> tuple:
    row = job_row(conn, job_id)
    return row["status"], row["attempt"], row["reclaims"], row["locked_by"]


def effects(conn) -> list[tuple[int, int, str]]:
    return [tuple(r) for r in conn.execute("SELECT job_id, attempt, worker FROM pgfence_examples.effects ORDER BY id")]


def db_now(conn) -> dt.datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def session_state(conn, pid: int) -> str | None:
    """State of the database session of the child ``pid`` (its
    application_name is ``pgfence worker host:pid:wN``, maybe truncated)."""
    rows = conn.execute(
        "SELECT a.state FROM pg_stat_activity a JOIN pgfence.all_jobs j"
        "  ON a.application_name = left('pgfence worker ' || j.locked_by, 63)"
        " WHERE a.datname = current_database() AND j.locked_by LIKE %s", (f"%:{pid}:w%",)).fetchall()
    return rows[0][0] if len(rows) == 1 else None


def counts(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*)::int FROM pgfence.all_jobs GROUP BY status").fetchall())


def worker_number(name: str) -> int:
    return int(WORKER_TITLE.match(name).group(1))


# -- 1. a child stopped mid-job ------------------------------------------------------


@pytest.mark.parametrize("kind", ["effect", "stubborn"])
def test_sigstopped_child_gets_no_renewals_and_cannot_commit(dsn, conn, supervisors, kind):
    """A child is stopped mid-job: the heartbeat stops renewing its lease,
    the other child reclaims the job (attempt 2) and completes it.  Resumed,
    the stopped child writes nothing: the effect handler checks its lease and
    gives up; the stubborn one, already inside its fenced transaction with its
    effect written, reaches the fence and is rolled back."""
    sup = supervisors(lease=3, lost_lease_kill_after=10)
    sup.wait_workers(2)
    seconds = 5.0 if kind == "effect" else 3.5
    job_id = enqueue(conn, kind, {"seconds": seconds})
    attempt, p = sup.wait(lambda: holder(conn, job_id), 20, "the first claim")
    assert attempt == 1
    # The child retitles itself just after its claim commits.
    sup.wait(lambda: WORKER_TITLE.match(sup.workers()[p]).group(3, 4, 5) == (kind, str(job_id), "1"), 5,
             "the child's title naming its job")
    # While the child runs, its lease is renewed.
    first_until = job_row(conn, job_id)["lease_until"]
    sup.wait(lambda: job_row(conn, job_id)["lease_until"] > first_until, 2.8, "a renewal of the running job")
    if kind == "stubborn":
        sup.wait(lambda: session_state(conn, p) == "idle in transaction", 5,
                 "the child inside its fenced transaction")

    os.kill(p, signal.SIGSTOP)
    stopped_at = db_now(conn)
    untils = []

    def reclaimed() -> dict | None:
        row = job_row(conn, job_id)
        if (row["status"], row["attempt"]) == ("running", 1):
            untils.append(row["lease_until"])
            return None
        return row

    row = sup.wait(reclaimed, 15, "the reclaim by the other child")
    q = pid_of(row["locked_by"])
    assert (row["status"], row["attempt"], row["reclaims"]) == ("running", 2, 1)
    assert q != p and q in sup.workers()
    assert state(p) == "T" and p in sup.workers()          # still stopped, not killed
    # lease_until stopped advancing: at most one renewal while the child's
    # tick was still fresh (liveness 1 s after its last tick), none after.
    assert untils and max(untils) <= stopped_at + dt.timedelta(seconds=1.0 + 3 + 0.5), (stopped_at, untils)

    os.kill(p, signal.SIGCONT)
    # The resumed child drops the job without a write and goes back to idle.
    sup.wait(lambda: sup.workers().get(p, "").endswith(" idle"), 10, "the resumed child idle again")
    sup.wait(lambda: job_row(conn, job_id)["status"] == "done", 10, "the reclaimer's completion")
    assert summary(conn, job_id) == ("done", 2, 1, None)
    assert effects(conn) == [(job_id, 2, str(q))]
    log = sup.log()
    if kind == "effect":
        # Nothing failed: the stopped child's lease ran out unrenewed.
        assert re.search(rf"job {job_id} attempt 1 lost its lease \((expired|renewal_rejected)\)", log), log
    else:
        assert f"job {job_id} attempt 1 lost its lease (fence_rejected)" in log, log
    # Not killed: it left the job on its own, well within lost-lease-kill-after.
    assert set(sup.workers()) == {p, q}
    assert "killing it" not in log
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


def test_a_kind_lease_shorter_than_the_renewal_interval_is_renewed_at_its_own_pace(dsn, conn, supervisors):
    """A kind with lease=1.5 under the default interval (a third of the 30 s
    lease, 10 s): its lease is renewed when a third of it has passed, so a
    handler that works for several of its leases, checking all along, ends
    done on its first attempt and no lease is lost."""
    sup = supervisors(lease=30)
    sup.wait_workers(2)
    job_id = enqueue(conn, "short_lease", {"seconds": 5})
    attempt, p = sup.wait(lambda: holder(conn, job_id), 20, "the claim")
    assert attempt == 1
    untils = set()

    def done() -> bool:
        row = job_row(conn, job_id)
        if row["status"] == "running":
            assert row["attempt"] == 1, row
            untils.add(row["lease_until"])
        return row["status"] == "done"

    sup.wait(done, 20, "the job done")
    assert summary(conn, job_id) == ("done", 1, 0, None)
    # Renewed again and again over its 5 s (at least every 0.5 s).
    assert len(untils) >= 5, sorted(untils)
    log = sup.log()
    assert "lost its lease" not in log and " lost: " not in log, log
    assert sup.alive(p)
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


def test_heartbeat_that_cannot_keep_a_kind_lease_is_refused_at_start(dsn, conn, tmp_path):
    """An explicit heartbeat longer than half a kind's lease: one line
    naming the kind, exit 2, for both `run` and `work`."""
    (tmp_path / f"{HANDLERS_MODULE}.py").write_text(HANDLERS_SOURCE)
    env = env_for(dsn)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    for command in ("run", "work"):
        result = pgfence(command, "--heartbeat", "1", "--handlers", f"pgfence.handlers.builtin,{HANDLERS_MODULE}",
                         env=env, timeout=30)
        assert result.returncode == 2, result
        assert result.stderr == (
            "pgfence: error: invalid heartbeat: 1s cannot keep the 1.5s lease of kind 'short_lease'; give at "
            "most half of it (0.75s), or leave heartbeat unset to renew each lease when a third of it has "
            "passed\n"), result.stderr
    # Half of the shortest lease is accepted.
    result = pgfence("work", "--burst", "--heartbeat", "0.75", "--handlers",
                     f"pgfence.handlers.builtin,{HANDLERS_MODULE}", env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    assert counts(conn) == {}


# -- 2. a child killed mid-job ----------------------------------------------------------


def test_sigkilled_child_job_is_released_at_once_and_completed_by_another(dsn, conn, supervisors):
    """A child is killed mid-job under a 30 s lease: its job is released at
    once (counted as a reclaim), run again by another child as attempt 2, and
    the arbiter starts a new child in its place."""
    sup = supervisors(lease=30)
    before = sup.wait_workers(2)
    job_id = enqueue(conn, "effect", {"seconds": 3})
    attempt, p = sup.wait(lambda: holder(conn, job_id), 20, "the first claim")
    assert attempt == 1 and p in before
    lease_left = scalar(conn, "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
                              " FROM pgfence.all_jobs WHERE id = %s", (job_id,))
    assert lease_left > 25
    # The claim commits before the child publishes it in its slot; kill it
    # once it shows the job in its title (set after the slot is written), so
    # the arbiter's line below can name the job it releases.
    sup.wait(lambda: (title(p) or "").endswith(f"job {job_id} attempt 1"), 10, "the job in the child's title")

    os.kill(p, signal.SIGKILL)
    killed = time.monotonic()
    # Back in the queue (or already reclaimed) within seconds, not 30.
    sup.wait(lambda: (h := holder(conn, job_id)) is None or h[0] == 2, 5,
             "the dead child's job released")
    attempt, q = sup.wait(lambda: (h := holder(conn, job_id)) and h[0] == 2 and h, 10, "the job run again")
    # Well before the 30 s lease would have run out (a loaded machine may
    # take a few seconds to fork and connect the replacement).
    assert time.monotonic() - killed < 10
    assert q != p
    sup.wait(lambda: job_row(conn, job_id)["status"] == "done", 10, "the second attempt's completion")
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "done", 2, 1, None, "worker died")
    assert effects(conn) == [(job_id, 2, str(q))]

    after = sup.wait_workers(2)
    assert p not in after and not sup.alive(p)
    new = set(after) - set(before)
    assert len(new) == 1 and q in after
    assert re.search(rf"worker \d+ \(pid {p}\) killed by SIGKILL holding 1 job\(s\): releasing them", sup.log())
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


# -- 3. the heartbeat manager killed ---------------------------------------------------------


def test_killed_heartbeat_manager_is_restarted_and_no_live_lease_runs_out(dsn, conn, supervisors):
    """The heartbeat manager is killed while two jobs longer than the lease
    run, after they have outlived their first lease: the arbiter starts a new
    one, which keeps renewing; no job is lost or reclaimed."""
    sup = supervisors(lease=2)
    sup.wait_workers(2)
    ids = [enqueue(conn, "effect", {"seconds": 5}) for _ in range(2)]
    holders = sup.wait(lambda: all(h := [holder(conn, i) for i in ids]) and h, 20, "both jobs running")
    assert [a for a, _ in holders] == [1, 1] and len({p for _, p in holders}) == 2
    # Both have run longer than one lease (renewed meanwhile).
    sup.wait(lambda: scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'running'"
                                  " AND clock_timestamp() - started_at > interval '2.3 seconds'") == 2,
             10, "both jobs past their first lease")
    old = sup.heartbeat()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    expired: list = []

    def new_heartbeat() -> int | None:
        expired.extend(conn.execute("SELECT id FROM pgfence.all_jobs WHERE status = 'running'"
                                    " AND lease_until < clock_timestamp()").fetchall())
        pid = sup.heartbeat()
        return pid if pid not in (None, old) else None

    new = sup.wait(new_heartbeat, 5, "a new heartbeat manager")
    assert time.monotonic() - killed < 3
    assert title(new).startswith("pgfence heartbeat [")

    def all_done() -> bool:
        expired.extend(conn.execute("SELECT id FROM pgfence.all_jobs WHERE status = 'running'"
                                    " AND lease_until < clock_timestamp()").fetchall())
        return all(job_row(conn, i)["status"] == "done" for i in ids)

    sup.wait(all_done, 15, "both jobs done")
    assert expired == []
    assert [summary(conn, i) for i in ids] == [("done", 1, 0, None)] * 2
    assert sorted(effects(conn)) == sorted((i, 1, str(p)) for i, (_, p) in zip(ids, holders))
    log = sup.log()
    assert "heartbeat manager killed by SIGKILL; restarting it" in log
    assert "lost its lease" not in log and "lost {" not in log, log
    assert sup.heartbeat() == new
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


# -- 4. SIGTERM: the graceful drain -----------------------------------------------------------


def test_sigterm_lets_running_jobs_finish_and_claims_nothing_new(dsn, conn, supervisors):
    sup = supervisors(graceful_timeout=10)
    children = sup.wait_workers(2)
    running = [enqueue(conn, "effect", {"seconds": 2}) for _ in range(2)]
    waiting = enqueue(conn, "effect", {"seconds": 2})
    sup.wait(lambda: all(holder(conn, i) for i in running), 20, "two jobs running")
    assert summary(conn, waiting) == ("queued", 0, 0, None)

    sup.signal(signal.SIGTERM)
    termed = time.monotonic()
    assert sup.wait_exit(10) == 0
    elapsed = time.monotonic() - termed
    assert elapsed < 10, elapsed
    assert [summary(conn, i) for i in running] == [("done", 1, 0, None)] * 2
    assert summary(conn, waiting) == ("queued", 0, 0, None)
    assert sorted(j for j, _, _ in effects(conn)) == sorted(running)
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'running'") == 0
    assert not any(sup.alive(p) for p in children)
    assert "SIGTERM: draining 2 workers" in sup.log()


def test_sigterm_past_the_graceful_timeout_releases_the_jobs_for_another_run(dsn, conn, supervisors):
    """Jobs longer than the graceful timeout: their children are killed at
    the deadline and the jobs handed back (not a reclaim); a second
    supervisor runs them to done as attempt 2."""
    sup = supervisors(graceful_timeout=1)
    children = sup.wait_workers(2)
    ids = [enqueue(conn, "effect", {"seconds": 3}) for _ in range(2)]
    sup.wait(lambda: all(holder(conn, i) for i in ids), 20, "both jobs running")

    sup.signal(signal.SIGTERM)
    termed = time.monotonic()
    assert sup.wait_exit(10) == 0
    elapsed = time.monotonic() - termed
    assert 1.0 <= elapsed < 3, elapsed
    assert [summary(conn, i) for i in ids] == [("queued", 1, 0, None)] * 2
    assert effects(conn) == []
    assert not any(sup.alive(p) for p in children)
    assert "still busy at the drain deadline: killing it" in sup.log()

    again = supervisors(label="again")
    sup.wait(lambda: all(job_row(conn, i)["status"] == "done" for i in ids), 20, "the second run's completions")
    assert [summary(conn, i) for i in ids] == [("done", 2, 0, None)] * 2
    rows = effects(conn)
    assert sorted((j, a) for j, a, _ in rows) == [(i, 2) for i in sorted(ids)]
    assert {int(w) for _, _, w in rows} <= set(again.workers())
    again.signal(signal.SIGTERM)
    assert again.wait_exit(10) == 0


def test_second_sigterm_cuts_the_drain_short(dsn, conn, supervisors):
    sup = supervisors(graceful_timeout=30)
    children = sup.wait_workers(2)
    ids = [enqueue(conn, "effect", {"seconds": 8}) for _ in range(2)]
    sup.wait(lambda: all(holder(conn, i) for i in ids), 20, "both jobs running")
    sup.signal(signal.SIGTERM)
    termed = time.monotonic()
    sup.wait(lambda: sup.title().endswith("graceful stop"), 5, "the arbiter draining")
    assert sup.proc.poll() is None and all(sup.alive(p) for p in children)
    assert [holder(conn, i)[0] for i in ids] == [1, 1]

    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(5) == 0
    assert time.monotonic() - termed < 4
    assert [summary(conn, i) for i in ids] == [("queued", 1, 0, None)] * 2
    assert effects(conn) == []
    assert not any(sup.alive(p) for p in children)
    assert "second stop signal: not waiting for the drain" in sup.log()


# -- 5. SIGINT: the fast stop ---------------------------------------------------------------


def test_sigint_kills_the_children_and_releases_their_jobs(dsn, conn, supervisors):
    sup = supervisors(graceful_timeout=30)
    children = sup.wait_workers(2)
    ids = [enqueue(conn, "effect", {"seconds": 8}) for _ in range(2)]
    sup.wait(lambda: all(holder(conn, i) for i in ids), 20, "both jobs running")
    sup.signal(signal.SIGINT)
    stopped = time.monotonic()
    assert sup.wait_exit(5) == 0
    assert time.monotonic() - stopped < 3
    assert [summary(conn, i) for i in ids] == [("queued", 1, 0, None)] * 2
    assert effects(conn) == []
    assert not any(sup.alive(p) for p in children)
    log = sup.log()
    assert "fast stop: killing 2 workers and releasing their jobs" in log
    assert len(re.findall(r"killed by SIGKILL holding 1 job\(s\): releasing them", log)) == 2, log


# -- 6. TTIN, TTOU and HUP ---------------------------------------------------------------------


def test_ttin_and_ttou_add_and_retire_a_worker(dsn, conn, supervisors):
    sup = supervisors(workers=2)
    two = sup.wait_workers(2)
    hb = sup.heartbeat()
    sup.signal(signal.SIGTTIN)
    three = sup.wait_workers(3)
    assert set(two) < set(three)
    assert sup.title().startswith("pgfence arbiter [3 workers]")
    sup.signal(signal.SIGTTOU)
    back = sup.wait_workers(2)
    # The oldest child is retired; the other original and the new one stay.
    oldest = min(two, key=lambda p: worker_number(two[p]))
    assert set(back) == set(three) - {oldest}
    sup.wait(lambda: not sup.alive(oldest), 5, "the retired child gone")
    assert sup.heartbeat() == hb
    # The two left still work.
    job_id = enqueue(conn, "effect", {"seconds": 0})
    sup.wait(lambda: job_row(conn, job_id)["status"] == "done", 10, "a job done after the resize")
    assert summary(conn, job_id) == ("done", 1, 0, None)
    assert len(effects(conn)) == 1 and int(effects(conn)[0][2]) in back
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


def test_sigterm_a_moment_after_a_fork_still_stops_the_new_child(dsn, conn, supervisors):
    """TTIN, then TERM as soon as the new child exists, before it has set its
    own signal handlers: the TERM the arbiter passes on must not be lost in
    the child (it was: the drain then waited the whole graceful timeout and
    killed the child)."""
    sup = supervisors(workers=1, graceful_timeout=20)
    one = sup.wait_workers(1)
    before = set(sup.children())
    sup.signal(signal.SIGTTIN)
    deadline = time.monotonic() + 10
    while not set(sup.children()) - before:     # busy: the window is a few ms
        assert time.monotonic() < deadline, sup.log()
    sup.signal(signal.SIGTERM)
    termed = time.monotonic()
    assert sup.wait_exit(10) == 0
    assert time.monotonic() - termed < 3
    log = sup.log()
    assert "still busy at the drain deadline" not in log
    assert len(re.findall(r"worker \d+ \(pid \d+\) exited with status 0", log)) == 2, log
    assert not any(sup.alive(p) for p in [*sup.seen, *one])


def test_sighup_swaps_the_children_without_losing_or_doubling_a_job(dsn, conn, supervisors):
    """SIGHUP while one job longer than the lease runs and a stream of short
    jobs flows: new children take over, the old ones finish what they hold
    (the long job's lease still renewed), and every job is done exactly once."""
    sup = supervisors(workers=2, lease=1.5)
    old = sup.wait_workers(2)
    long_id = enqueue(conn, "effect", {"seconds": 4})
    _, long_pid = sup.wait(lambda: holder(conn, long_id), 20, "the long job running")
    sup.wait(lambda: scalar(conn, "SELECT clock_timestamp() - started_at > interval '1.8 seconds'"
                                  " FROM pgfence.all_jobs WHERE id = %s", (long_id,)), 10, "the long job past its first lease")
    ids = [enqueue(conn, "effect", {"seconds": 0.05}) for _ in range(50)]
    sup.wait(lambda: counts(conn).get("done", 0) >= 5, 20, "the stream flowing")
    sup.signal(signal.SIGHUP)
    assert counts(conn).get("done", 0) < 50          # the HUP came mid-stream
    assert holder(conn, long_id) == (1, long_pid)
    for _ in range(5):
        done = counts(conn).get("done", 0)
        ids += [enqueue(conn, "effect", {"seconds": 0.05}) for _ in range(10)]
        target = min(done + 5, len(ids))
        sup.wait(lambda target=target: counts(conn).get("done", 0) >= target, 20, "the stream flowing")
    new = sup.wait(lambda: len(w := sup.workers()) == 2 and not set(w) & set(old) and w,
                   20, "two new children and none of the old")
    sup.wait(lambda: counts(conn) == {"done": 101}, 30, "all 101 jobs done")
    assert not any(sup.alive(p) for p in old)

    rows = conn.execute("SELECT id, status, attempt, reclaims FROM pgfence.all_jobs ORDER BY id").fetchall()
    assert rows == [(i, "done", 1, 0) for i in sorted([long_id, *ids])]
    done = effects(conn)
    assert sorted((j, a) for j, a, _ in done) == [(i, 1) for i in sorted([long_id, *ids])]
    assert (long_id, 1, str(long_pid)) in done
    by = {int(w) for j, _, w in done if j != long_id}
    assert by & set(old) and by & set(new), (by, old, new)
    assert by <= set(old) | set(new)
    log = sup.log()
    assert "SIGHUP: reloading handlers and settings" in log
    assert "lost its lease" not in log, log
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


# -- 7. a lost lease reaches a child that ignores it ---------------------------------------------


def test_cancelled_job_of_a_stubborn_handler_gets_its_child_killed(dsn, conn, supervisors):
    sup = supervisors(lease=30, heartbeat=0.5, lost_lease_kill_after=1)
    before = sup.wait_workers(2)
    job_id = enqueue(conn, "stubborn", {"seconds": 30})
    attempt, p = sup.wait(lambda: holder(conn, job_id), 20, "the claim")
    assert attempt == 1 and p in before
    sup.wait(lambda: session_state(conn, p) == "idle in transaction", 5, "the child inside its fenced transaction")

    # Taken before the command: the arbiter now kills on time, not at its
    # next half-second turn, so the command's own exit can outlast the rest.
    cancelled = time.monotonic()
    result = pgfence("cancel", str(job_id), dsn=dsn)
    assert (result.returncode, result.stdout) == (0, f"cancelled 1 job(s): {job_id}\n"), result.stderr
    sup.wait(lambda: not sup.alive(p), 10, "the child killed")
    elapsed = time.monotonic() - cancelled
    assert 1.0 <= elapsed < 5, elapsed
    after = sup.wait_workers(2)
    assert p not in after and len(set(after) - set(before)) == 1
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "cancelled", 1, 0, None, "cancelled by an operator")
    assert effects(conn) == []
    log = sup.log()
    assert re.search(rf"\(pid {p}\) still runs job {job_id} attempt 1 1s after its lease was lost "
                     r"\(cancelled\): killing it", log), log
    assert re.search(rf"\(pid {p}\) killed by SIGKILL", log), log
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0
    assert job_row(conn, job_id) == row


def test_timed_out_stubborn_handler_is_killed_and_reported_as_an_error(dsn, conn, supervisors, tmp_path):
    """A handler with timeout=1 that never looks at its lease: the heartbeat
    stops renewing it at the timeout, the arbiter kills its child, and the
    attempt is reported as an error: retried (queued) while attempts are left,
    after the workers' backoff (backoff_base 4: 2 to 4 s after attempt 1),
    failed on the last one.  Its effect, written in its open transaction, is
    rolled back."""
    config = tmp_path / "backoff.toml"
    config.write_text("backoff_base = 4\n")
    sup = supervisors(lease=30, heartbeat=0.5, lost_lease_kill_after=1, config=str(config))
    children = sup.wait_workers(2)
    last = enqueue(conn, "stubborn_timeout", {"seconds": 30}, max_attempts=1)
    retried = enqueue(conn, "stubborn_timeout", {"seconds": 30}, max_attempts=2)
    first = sup.wait(lambda: all(h := [holder(conn, i) for i in (last, retried)]) and h, 20, "both running")
    pids = {p for _, p in first}
    assert pids == set(children) and [a for a, _ in first] == [1, 1]

    error = "timed out after 1s; worker killed"
    sup.wait(lambda: job_row(conn, last)["status"] == "failed", 10, "the last attempt failed")
    row = job_row(conn, last)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "failed", 1, 0, None, error)
    sup.wait(lambda: job_row(conn, retried)["last_error"] is not None, 10, "the first attempt reported")
    row = job_row(conn, retried)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "queued", 1, 0, None, error)
    # The heartbeat process reported it with the settings' backoff, not a
    # fixed second (measured just after the report, a poll's time late).
    window = scalar(conn, "SELECT extract(epoch FROM run_at - clock_timestamp())::float8 FROM pgfence.all_jobs "
                          "WHERE id = %s", (retried,))
    assert 1.2 <= window <= 4.0, window
    sup.wait(lambda: not any(sup.alive(p) for p in pids), 5, "both children killed")
    assert not set(sup.wait_workers(2)) & pids

    # Its second (and last) attempt ends the same way, failed.
    sup.wait(lambda: job_row(conn, retried)["status"] == "failed", 15, "the retried job failed")
    row = job_row(conn, retried)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "failed", 2, 0, None, error)
    assert effects(conn) == []
    log = sup.log()
    kills = set(re.findall(r"\(pid (\d+)\) still runs job (\d+) attempt (\d+) 1s after its timeout "
                           r"\(1s\): killing it", log))
    assert {(int(j), int(a)) for _, j, a in kills} == {(last, 1), (retried, 1), (retried, 2)}, log
    assert len({p for p, _, _ in kills}) == 3
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0


def test_a_timed_out_attempt_is_dead_before_the_next_one_starts(dsn, conn, supervisors):
    """timeout=1, lease=3, lost-lease-kill-after=1, and a first attempt that
    works on past its timeout: its child is told at the timeout, the job
    stays held (renewed) until the child is killed one second later, and is
    then released at once as a timed-out attempt; attempt 2 starts only
    after attempt 1's process is dead, and ends done."""
    sup = supervisors(lost_lease_kill_after=1)
    sup.wait_workers(2)
    job_id = enqueue(conn, "overrun", {}, max_attempts=3)
    attempt, p = sup.wait(lambda: holder(conn, job_id), 20, "the claim")
    assert attempt == 1
    overlaps = []

    def done() -> bool:
        row = job_row(conn, job_id)
        if row["attempt"] >= 2 and sup.alive(p):
            overlaps.append((row["status"], row["attempt"], state(p)))
        return row["status"] == "done"

    sup.wait(done, 20, "attempt 2 done")
    assert overlaps == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["reclaims"], row["locked_by"], row["last_error"]) == (
        "done", 2, 0, None, "timed out after 1s; worker killed")
    rows = conn.execute("SELECT attempt, idempotency_key, worker FROM pgfence_examples.effects"
                        " WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
    assert [(a, k.rpartition(":")[0] if k.startswith("told:") else k, w) for a, k, w in rows][:2] == [
        (1, "start:none", str(p)), (1, "told:timeout", str(p))], rows
    # Told at its timeout, before the kill a second later.
    told_after = float(rows[1][1].rpartition(":")[2])
    assert 0.9 <= told_after < 2.0, rows
    # Attempt 2 ran in the other child and found attempt 1's process dead.
    assert len(rows) == 3 and rows[2][:2] == (2, "start:dead") and rows[2][2] != str(p), rows
    assert not sup.alive(p)
    log = sup.log()
    assert re.search(rf"\(pid {p}\) still runs job {job_id} attempt 1 1s after its timeout \(1s\): killing it",
                     log), log
    assert f"job {job_id} (overrun) attempt 1 failed" not in log   # reported by the heartbeat, not the child
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(10) == 0
