"""Periodic jobs under real ``pgfence run`` supervisors, real signals and a
real PostgreSQL.

Each test declares its schedules in a handler module written to its tmp
folder (``handler(kind, every=...)``, with the handlers of
tests/periodic_handlers.py) or in a TOML settings file (``[[periodic]]``
tables, ``--config``), starts supervisors and looks at the database: the
rows of ``pgfence.schedule_ticks``, the jobs of each tick (found by their
dedupe key ``pgfence:periodic:<schedule>:<tick>``, finished or not, through
``pgfence.all_jobs``) and ``pgfence.schedules``.  Every expected count is
computed from the database's clock, the only clock that decides ticks.

1. three supervisors (host clocks skewed by -30, 0, +30 s) enqueue every
   tick of an every-second schedule exactly once, with no gap;
2. overlap: ``skip`` never starts a second run while one runs (skipped
   ticks recorded and counted); ``queue`` runs the ticks one after another,
   in tick order, each once;
3. every supervisor stopped for three ticks: ``catch_up`` latest enqueues
   one tick of the gap, none zero, all every one;
4. a schedule whose runs all fail goes on ticking, and says so on /metrics;
5. a schedule removed from the settings file is no longer ticked after
   SIGHUP;
6. a bad schedule at start: one line, exit 2, nothing declared.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import urllib.parse
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest

from metricstools import free_port
from periodic_handlers import RUNS_TABLE
from pgtools import env_for, pgfence, scalar, wait_for
from supervisors import Supervisor, supervisor_fixture
from pgfence.scheduling.schedule import TICK_KEY_PREFIX, Schedule, tick_key

HANDLERS_MODULE = "pgfence_periodic_test_schedules"
SECOND = dt.timedelta(seconds=1)


# -- supervisors ------------------------------------------------------------------


def supervisor_defaults(tmp_path: Path) -> dict[str, Any]:
    """One worker, a metrics port of its own, the builtin handlers and the
    test's module (``write_schedules``) once it is written."""
    modules = "pgfence.handlers.builtin"
    if (tmp_path / f"{HANDLERS_MODULE}.py").exists():
        modules += f",{HANDLERS_MODULE}"
    return {"metrics_port": free_port(), "workers": 1, "poll_interval": 0.2, "handlers": modules}


#: Start ``pgfence run`` on the test's database (``supervisor_defaults``;
#: ``config=`` a settings file, ``args=`` more flags); every process is
#: killed afterwards.
supervisors = supervisor_fixture(defaults=supervisor_defaults)


def write_schedules(tmp_path: Path, body: str) -> None:
    """The test's handler module: tests/periodic_handlers.py's functions
    registered by ``body``."""
    (tmp_path / f"{HANDLERS_MODULE}.py").write_text(
        "from pgfence import handler, periodic  # noqa: F401\n"
        "from periodic_handlers import always_fails, noop, record_run  # noqa: F401\n\n" + body)


def no_problems(*sups: Supervisor) -> None:
    for sup in sups:
        log = sup.log()
        assert "Traceback" not in log and " ERROR " not in log, f"--- {sup.label} ---\n{log}"


# -- the database -------------------------------------------------------------------


class Tick(NamedTuple):
    tick: dt.datetime
    outcome: str
    job_id: int | None
    decided_at: dt.datetime


class Run(NamedTuple):
    id: int
    dedupe_key: str
    status: str
    attempt: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


def db_now(conn: psycopg.Connection) -> dt.datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def ticks(conn: psycopg.Connection, schedule: str) -> list[Tick]:
    rows = conn.execute("SELECT tick, outcome, job_id, decided_at FROM pgfence.schedule_ticks"
                        " WHERE schedule = %s ORDER BY tick", (schedule,)).fetchall()
    return [Tick(*row) for row in rows]


def jobs(conn: psycopg.Connection, schedule: str) -> dict[int, Run]:
    """The jobs of ``schedule``'s ticks, live or finished, by id."""
    prefix = f"{TICK_KEY_PREFIX}{urllib.parse.quote(schedule, safe='')}:"
    rows = conn.execute("SELECT id, dedupe_key, status, attempt, started_at, finished_at FROM pgfence.all_jobs"
                        " WHERE starts_with(dedupe_key, %s) ORDER BY id", (prefix,)).fetchall()
    return {row[0]: Run(*row) for row in rows}


def schedule_row(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgfence.schedules WHERE name = %s", (name,))
    row = cur.fetchone()
    return dict(zip([c.name for c in cur.description], row, strict=False)) if row else {}


def grid(every: float, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
    """The ticks of an ``every`` schedule in (after, until]."""
    return list(Schedule("grid", "noop", every=float(every)).ticks(after, until))


def contiguous(rows: list[Tick], every: float) -> None:
    """Every tick from the first row's to the last one's has its row."""
    assert rows, "no tick at all"
    assert [r.tick for r in rows] == [rows[0].tick, *grid(every, rows[0].tick, rows[-1].tick)], \
        [r.tick for r in rows]


def wait_db(conn: psycopg.Connection, until: dt.datetime, timeout: float) -> dt.datetime:
    """Wait until the database's clock has passed ``until``; its reading."""
    return wait_for(lambda: (now := db_now(conn)) >= until and now, timeout=timeout, interval=0.05,
                    message=f"the database clock past {until}")


def metric(parsed: dict, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in parsed.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]


# -- 1. every tick once, whatever the supervisors' clocks -----------------------------


@pytest.mark.parametrize("seconds, offsets", [
    pytest.param(10, (-30, 0, 30), id="10s-skewed"),
    pytest.param(60, (0, 0, 0), id="60s", marks=pytest.mark.slow),
    pytest.param(60, (-30, 0, 30), id="60s-skewed", marks=pytest.mark.slow),
])
def test_three_supervisors_enqueue_every_tick_exactly_once(conn, tmp_path, supervisors, seconds, offsets):
    """Three supervisors declare one every-second schedule (overlap allow:
    every tick gets a job); over the window, each tick of the database's
    clock has exactly one row and one job with its key, none is decided
    before its time (a host clock 30 s ahead enqueues nothing early), and
    there is no gap from the first tick to the last."""
    write_schedules(tmp_path, 'handler("each_second", every=1, overlap="allow")(noop)\n')
    sups = [supervisors(env={"PGFENCE_TEST_HOST_CLOCK_OFFSET": str(offset)}) for offset in offsets]
    for sup in sups:
        sup.wait_ready(1)
    wait_for(lambda: schedule_row(conn, "each_second"), timeout=10, message="the schedule declared")
    start = db_now(conn)
    end = wait_db(conn, start + seconds * SECOND, timeout=seconds + 30)
    wait_for(lambda: schedule_row(conn, "each_second")["checked_until"] >= end, timeout=10,
             message="every tick up to the window's end decided")

    rows = ticks(conn, "each_second")
    window = [r for r in rows if start < r.tick <= end]
    assert [r.tick for r in window] == grid(1, start, end)
    assert len(window) >= seconds
    assert {r.outcome for r in rows} == {"enqueued"}
    early = [r for r in rows if r.decided_at < r.tick]
    assert not early, f"ticks decided before their time on the database clock: {early}"
    contiguous(rows, 1)

    found = jobs(conn, "each_second")
    assert sorted(found) == sorted(r.job_id for r in rows), "a job without its row, or a row without its job"
    assert [found[r.job_id].dedupe_key for r in rows] == [tick_key("each_second", r.tick) for r in rows]
    keys = [j.dedupe_key for j in found.values()]
    assert len(keys) == len(set(keys)), "a tick enqueued twice"

    # Each skewed supervisor's gauge shows its host clock minus the database's.
    skews = {offset: metric(sup.metrics(), "pgfence_periodic_host_clock_skew_seconds")
             for sup, offset in zip(sups, offsets, strict=True) if offset}
    assert all(len(skew) == 1 and abs(skew[0] - offset) < 2 for offset, skew in skews.items()), skews
    for sup in sups:
        assert sup.stop() == 0
    no_problems(*sups)


# -- 2. overlap -------------------------------------------------------------------------


def run_intervals(conn: psycopg.Connection) -> list[tuple[int, dt.datetime, dt.datetime | None]]:
    """(job id, start, end) of each run record_run recorded, by start."""
    return conn.execute("""
        SELECT s.job_id, s.at, e.at FROM periodic_test.runs s
          LEFT JOIN periodic_test.runs e ON e.job_id = s.job_id AND e.attempt = s.attempt AND e.phase = 'end'
         WHERE s.phase = 'start' ORDER BY s.at""").fetchall()


def assert_one_at_a_time(conn: psycopg.Connection, found: dict[int, Run]) -> None:
    """No two runs overlapped: by what the handler recorded, and by the
    jobs' started_at / finished_at."""
    runs = run_intervals(conn)
    for (a, _, a_end), (b, b_start, _) in itertools.pairwise(runs):
        assert a_end is not None and a_end <= b_start, f"job {b} started while job {a} ran: {runs}"
    done = sorted((j for j in found.values() if j.started_at is not None), key=lambda j: j.started_at)
    for a, b in itertools.pairwise(done):
        assert a.finished_at is not None and a.finished_at <= b.started_at, (a, b)


def test_overlap_skip_never_starts_a_second_run(conn, tmp_path, supervisors):
    """Every second, a run of 2.5 s, on two supervisors of two workers each
    (four could run at once): no run starts before the previous one ended;
    the ticks in between are recorded skipped, and the counters of the two
    supervisors add up to the rows."""
    conn.execute(RUNS_TABLE)
    write_schedules(tmp_path, 'handler("slow_skip", every=1, overlap="skip", payload={"seconds": 2.5})(record_run)\n')
    sups = [supervisors(workers=2) for _ in range(2)]
    for sup in sups:
        sup.wait_ready(2)
    wait_for(lambda: sum(j.status == "done" for j in jobs(conn, "slow_skip").values()) >= 3, timeout=40,
             interval=0.1, message="three runs done")

    def consistent() -> tuple[list[Tick], dict[str, float]] | None:
        before = ticks(conn, "slow_skip")
        parsed = [sup.metrics() for sup in sups]
        after = ticks(conn, "slow_skip")
        counted = {outcome: sum(sum(metric(p, "pgfence_periodic_ticks_total", schedule="slow_skip",
                                           outcome=outcome)) for p in parsed)
                   for outcome in ("enqueued", "skipped", "queued", "missed")}
        rows = {outcome: sum(r.outcome == outcome for r in after) for outcome in ("enqueued", "skipped", "queued")}
        if before == after and counted == {**rows, "missed": 0}:
            return after, counted
        return None

    rows, counted = wait_for(consistent, timeout=15, interval=0.05,
                             message="the ticks counters equal to the rows")
    assert counted["skipped"] >= 2, counted
    contiguous(rows, 1)
    assert {r.outcome for r in rows} == {"enqueued", "skipped"}
    found = jobs(conn, "slow_skip")
    enqueued = [r for r in rows if r.outcome == "enqueued"]
    assert sorted(found) == sorted(r.job_id for r in enqueued)
    # A tick is enqueued only once the previous run has finished.
    for prev, nxt in itertools.pairwise(enqueued):
        previous = found[prev.job_id]
        assert previous.finished_at is not None and previous.finished_at <= nxt.decided_at, (previous, nxt)
    assert_one_at_a_time(conn, found)
    for sup in sups:
        assert sup.stop() == 0
    no_problems(*sups)


def test_overlap_queue_runs_each_tick_in_turn(conn, tmp_path, supervisors):
    """Every two seconds; the first run waits for a file, and the ticks
    meanwhile queue up behind it.  Once the file exists the line drains: each
    queued tick's job runs after the previous one ended, in tick order, and
    every tick gets its one job, done."""
    conn.execute(RUNS_TABLE)
    flag = tmp_path / "go"
    write_schedules(tmp_path, f'handler("in_line", every=2, overlap="queue", payload={{"file": {str(flag)!r}}})'
                              '(record_run)\n')
    sups = [supervisors(workers=2) for _ in range(2)]
    for sup in sups:
        sup.wait_ready(2)
    first = wait_for(lambda: [r for r in ticks(conn, "in_line") if r.outcome == "enqueued"], timeout=15,
                     message="the first tick enqueued")[0]
    wait_for(lambda: sum(r.outcome == "queued" for r in ticks(conn, "in_line")) >= 3, timeout=30, interval=0.1,
             message="three ticks queued behind the first run")
    assert jobs(conn, "in_line")[first.job_id].status == "running"
    assert [r.outcome for r in ticks(conn, "in_line")].count("enqueued") == 1
    flag.touch()

    def drained() -> list[Tick] | None:
        rows = ticks(conn, "in_line")
        found = jobs(conn, "in_line")
        if len(rows) >= 5 and all(r.outcome == "enqueued" and found[r.job_id].status == "done" for r in rows):
            return rows
        return None

    rows = wait_for(drained, timeout=40, interval=0.02, message="every queued tick run and done")
    contiguous(rows, 2)
    found = jobs(conn, "in_line")
    assert sorted(found) == sorted(r.job_id for r in rows)
    assert all(found[r.job_id].attempt == 1 for r in rows)
    # In tick order: each tick's job was enqueued, and started, after the
    # previous tick's job.
    ordered = [found[r.job_id] for r in rows]
    assert [j.id for j in ordered] == sorted(j.id for j in ordered)
    assert [j.started_at for j in ordered] == sorted(j.started_at for j in ordered)   # type: ignore[type-var]
    # The ticks that waited were enqueued once the run before them ended.
    waited = [r for r in rows if r.decided_at - r.tick > 2 * SECOND]
    assert len(waited) >= 3, rows
    for prev, nxt in itertools.pairwise(rows):
        finished = found[prev.job_id].finished_at
        assert finished is not None and finished <= nxt.decided_at, (prev, nxt, finished)
    assert_one_at_a_time(conn, found)
    queued = sum(sum(metric(sup.metrics(), "pgfence_periodic_ticks_total", schedule="in_line", outcome="queued"))
                 for sup in sups)
    assert 3 <= queued < len(rows), (queued, rows)
    for sup in sups:
        assert sup.stop() == 0
    no_problems(*sups)


# -- 3. catch-up after every supervisor was stopped -------------------------------------


DOWNTIME_TOML = """\
[[periodic]]
name = "gap_latest"
kind = "noop"
every = 4
catch_up = "latest"

[[periodic]]
name = "gap_none"
kind = "noop"
every = "4s"
catch_up = "none"

[[periodic]]
name = "gap_all"
kind = "noop"
every = 4
catch_up = "all"
overlap = "allow"
"""


def test_catch_up_after_every_supervisor_stopped(conn, tmp_path, supervisors):
    """Two supervisors tick three every-4s schedules; both stop (SIGTERM) and
    stay down for three ticks or more; once one starts again, the ticks of
    the gap (checked_until at the stop, the first round's clock] are caught
    up: latest one (the most recent), none zero, all every one; the others
    are counted missed."""
    names = ("gap_latest", "gap_none", "gap_all")
    config = tmp_path / "pgfence.toml"
    config.write_text(DOWNTIME_TOML)
    sups = [supervisors(config=config) for _ in range(2)]
    for sup in sups:
        sup.wait_ready(1)
    wait_for(lambda: all(ticks(conn, n) for n in names), timeout=20, message="a tick of each schedule")
    for sup in sups:
        assert sup.stop() == 0
    no_problems(*sups)
    stopped = {n: schedule_row(conn, n) for n in names}
    before = {n: ticks(conn, n) for n in names}
    last = max(row["checked_until"] for row in stopped.values())

    # Down until three ticks have passed, and restart just after a tick, so
    # that the first round comes well before the next one.
    def just_after_a_tick() -> bool:
        now = db_now(conn)
        gap = grid(4, last, now)
        return len(gap) >= 3 and now - gap[-1] < 0.5 * SECOND

    wait_for(just_after_a_tick, timeout=40, interval=0.02, message="three ticks down")
    restarted = db_now(conn)
    again = supervisors(config=config)

    def first_round() -> dict[str, dt.datetime] | None:
        rows = conn.execute("SELECT name, checked_until FROM pgfence.schedules WHERE name = ANY(%s)",
                            (list(names),)).fetchall()
        moved = {n: c for n, c in rows if c > stopped[n]["checked_until"]}
        return moved if len(moved) == len(names) else None

    first = again.wait(lambda: first_round(), 30, "the first round after the restart")
    # One round decided all three schedules (one transaction).
    assert max(first.values()) - min(first.values()) < SECOND, first
    caught = {n: grid(4, stopped[n]["checked_until"], first[n]) for n in names}
    assert all(len(gap) >= 3 for gap in caught.values()), caught
    assert all(first[n] > restarted for n in names)

    rows = {n: [r for r in ticks(conn, n) if r not in before[n]] for n in names}
    gap_rows = {n: [r for r in rows[n] if r.tick <= first[n]] for n in names}
    now = {n: schedule_row(conn, n) for n in names}
    missed = {n: now[n]["missed_ticks"] - stopped[n]["missed_ticks"] for n in names}

    assert [r.tick for r in gap_rows["gap_latest"]] == [caught["gap_latest"][-1]]
    assert missed["gap_latest"] == len(caught["gap_latest"]) - 1
    assert gap_rows["gap_none"] == []
    assert missed["gap_none"] == len(caught["gap_none"])
    assert [r.tick for r in gap_rows["gap_all"]] == caught["gap_all"]
    assert missed["gap_all"] == 0
    for n in names:
        assert all(r.outcome == "enqueued" for r in gap_rows[n]), gap_rows[n]
        found = jobs(conn, n)
        assert [found[r.job_id].dedupe_key for r in gap_rows[n]] == [tick_key(n, r.tick) for r in gap_rows[n]]

    # And the schedules tick on as usual afterwards.
    again.wait(lambda: all(any(r.tick > first[n] for r in ticks(conn, n)) for n in names), 15,
               "a tick of each schedule after the catch-up")
    for n in names:
        after = [r for r in ticks(conn, n) if r.tick > first[n]]
        assert schedule_row(conn, n)["missed_ticks"] == now[n]["missed_ticks"]
        assert [r.tick for r in after] == grid(4, first[n], after[-1].tick)
    assert again.stop() == 0
    no_problems(again)


# -- 4. failing runs ---------------------------------------------------------------------


def test_failing_runs_do_not_stop_the_schedule(conn, tmp_path, supervisors):
    """A schedule whose handler always raises (two attempts, a tiny
    backoff): its runs end failed, the ticks after the first failure still
    come, and /metrics says the last run failed (and not for a schedule
    whose runs succeed)."""
    write_schedules(tmp_path, 'handler("always_fails", every=1, max_attempts=2)(always_fails)\n'
                              'handler("succeeds", every=1)(noop)\n')
    sup = supervisors(workers=2, args=("--backoff-base", "0.01", "--backoff-max", "0.05"))
    sup.wait_ready(2)
    first_failure = sup.wait(
        lambda: min((j.finished_at for j in jobs(conn, "always_fails").values() if j.status == "failed"),
                    default=None), 30, "a failed run")
    sup.wait(lambda: len([r for r in ticks(conn, "always_fails")
                          if r.outcome == "enqueued" and r.decided_at > first_failure]) >= 3,
             20, "three ticks enqueued after the first failure")
    sup.wait(lambda: metric(sup.metrics(), "pgfence_periodic_last_run_failed", schedule="always_fails") == [1.0],
             10, "pgfence_periodic_last_run_failed 1")
    assert metric(sup.metrics(), "pgfence_periodic_last_run_failed", schedule="succeeds") == [0.0]
    assert sup.stop() == 0
    found = jobs(conn, "always_fails").values()
    finished = [j for j in found if j.status not in ("queued", "running")]
    assert len(finished) >= 3
    assert {(j.status, j.attempt) for j in finished} == {("failed", 2)}
    contiguous(ticks(conn, "always_fails"), 1)
    assert {j.status for j in jobs(conn, "succeeds").values()} <= {"queued", "running", "done"}


# -- 5. a schedule removed, then SIGHUP --------------------------------------------------------


KEPT = """\
[[periodic]]
name = "kept"
kind = "noop"
every = 1
"""
REMOVED = """\
[[periodic]]
name = "removed"
kind = "noop"
every = 1
"""


def test_a_schedule_removed_from_the_settings_is_not_ticked_after_sighup(conn, tmp_path, supervisors):
    """Two TOML schedules; one is taken out of the file and the supervisor
    gets SIGHUP: once its new heartbeat has declared the schedules again,
    the removed one gets no tick (a tick of slack around that moment), the
    other ticks on."""
    config = tmp_path / "pgfence.toml"
    config.write_text(KEPT + "\n" + REMOVED)
    sup = supervisors(config=config)
    sup.wait_ready(1)
    sup.wait(lambda: len(ticks(conn, "removed")) >= 2 and ticks(conn, "kept"), 20, "both schedules ticking")
    declared = schedule_row(conn, "kept")["declared_at"]
    config.write_text(KEPT)
    sup.signal(signal.SIGHUP)
    reloaded = sup.wait(lambda: (at := schedule_row(conn, "kept")["declared_at"]) > declared and at, 30,
                        "the schedules declared again after SIGHUP")
    sup.wait(lambda: len([r for r in ticks(conn, "kept") if r.tick > reloaded]) >= 3, 20,
             "three ticks of the kept schedule after the reload")
    late = [r for r in ticks(conn, "removed") if r.tick > reloaded + SECOND]
    assert not late, f"ticks of the removed schedule after the reload at {reloaded}: {late}"
    contiguous(ticks(conn, "kept"), 1)
    assert "SIGHUP: reloading handlers and settings" in sup.log()
    assert sup.stop() == 0
    no_problems(sup)


# -- 6. a bad schedule at start ----------------------------------------------------------------


@pytest.mark.parametrize("toml, says", [
    pytest.param('cron = "61 * * * *"', "cron", id="cron"),
    pytest.param('cron = "0 3 * * *"\ntz = "Mars/Olympus_Mons"', "time zone", id="tz"),
    pytest.param("every = 0.5", "every", id="every"),
])
def test_a_bad_schedule_is_refused_at_start(conn, dsn, tmp_path, toml, says):
    """An invalid cron expression, an unknown time zone, an interval under a
    second: one line on stderr, exit 2, no traceback, no schedule declared."""
    config = tmp_path / "pgfence.toml"
    config.write_text(f'[[periodic]]\nname = "misconfigured"\nkind = "noop"\n{toml}\n')
    done = pgfence("run", "--workers", "1", "--config", str(config), dsn=dsn, timeout=30)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert says in lines[0] and "misconfigured" in lines[0], lines
    assert scalar(conn, "SELECT count(*) FROM pgfence.schedules") == 0


def test_a_bad_schedule_in_code_is_refused_at_start(conn, dsn, tmp_path):
    """The same from a handler module: ``@handler(every=0.5)``."""
    write_schedules(tmp_path, 'handler("too_often", every=0.5)(noop)\n')
    env = env_for(dsn)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    done = pgfence("run", "--workers", "1", "--handlers", f"pgfence.handlers.builtin,{HANDLERS_MODULE}",
                   env=env, timeout=30)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "every" in lines[0] and "too_often" in lines[0], lines
    assert scalar(conn, "SELECT count(*) FROM pgfence.schedules") == 0


