"""The load test's concurrency limits: the limited mixes (``limited=W@N``,
``keyed=W@N/K``, ``keyed=W@M:N/K``) and the audit that proves, from the
attempt history, that no instant saw more attempts holding a live lease than
a limit allows.  Pure logic with exact inputs first (the overlap count, the
placing of attempts, the check), then real runs: one with faults that must
pass and agree with the database, one whose limit is raised behind its back
that must fail."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest
from pgtools import pgfence, scalar, spawn, wait_for

from pgfence.tools.loadtest import audit, audit_limits, mix
from pgfence.tools.loadtest.mix import Limit

ZERO = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return ZERO + dt.timedelta(seconds=seconds)


# -- the overlap count ------------------------------------------------------------------------


def test_max_overlap_counts_the_intervals_that_hold_one_instant():
    assert audit_limits.max_overlap([]) == (0, None)
    assert audit_limits.max_overlap([(1, 4)]) == (1, 1)
    # Nested and crossing: 0..10 holds 2..5 and 4..6; at 4 all three.
    assert audit_limits.max_overlap([(0, 10), (2, 5), (4, 6)]) == (3, 4)
    # The first instant the maximum is reached, whatever the input order.
    assert audit_limits.max_overlap([(7, 9), (8, 9), (1, 3), (2, 3)]) == (2, 2)
    # Disjoint.
    assert audit_limits.max_overlap([(0, 1), (2, 3), (4, 5)]) == (1, 0)
    # Same start: both hold it.
    assert audit_limits.max_overlap([(3, 4), (3, 8)]) == (2, 3)


def test_touching_intervals_do_not_overlap():
    """One attempt ends at the instant the next starts (a completion whose
    commit admitted the next job): never two at once."""
    assert audit_limits.max_overlap([(0, 1), (1, 2), (2, 3)]) == (1, 0)
    assert audit_limits.max_overlap([(1, 2), (0, 1)]) == (1, 0)
    # Two chains of touching intervals side by side: two at once, not four.
    assert audit_limits.max_overlap([(0, 5), (5, 9), (2, 5), (5, 7)]) == (2, 2)
    # One microsecond of overlap is an overlap.
    assert audit_limits.max_overlap([(0, 1_000_001), (1_000_000, 2_000_000)]) == (2, 1_000_000)


def test_an_interval_of_no_length_holds_its_instant():
    # Inside another, or at its start: two; at another's end: one.
    assert audit_limits.max_overlap([(0, 10), (5, 5)]) == (2, 5)
    assert audit_limits.max_overlap([(5, 10), (5, 5)]) == (2, 5)
    assert audit_limits.max_overlap([(0, 5), (5, 5)]) == (1, 0)
    assert audit_limits.max_overlap([(5, 5), (5, 5)]) == (2, 5)
    assert audit_limits.holds(5, 5, 5) and not audit_limits.holds(0, 5, 5) and audit_limits.holds(5, 10, 5)


def test_an_interval_that_ends_before_it_starts_is_refused():
    with pytest.raises(ValueError, match="ends before it starts"):
        audit_limits.max_overlap([(0, 1), (3, 2)])


# -- placing attempts from the history ------------------------------------------------------


def job(job_id: int, *, attempt: int = 1, status: str = "done", start: float = 0.0,
        end: float | None = 1.0) -> dict:
    return {"id": job_id, "kind": "loadtest_limited_c2", "status": status, "attempt": attempt, "reclaims": 0,
            "last_error": None, "created_at": ZERO, "run_at": ZERO, "started_at": at(start),
            "finished_at": None if end is None else at(end)}


def row(job_id: int, attempt: int, outcome: str, start: float | None, end: float) -> dict:
    return {"job_id": job_id, "attempt": attempt, "outcome": outcome,
            "started_at": None if start is None else at(start), "ended_at": at(end)}


def test_attempts_are_placed_from_their_claim_to_the_end_of_their_live_lease():
    jobs = [job(1, attempt=3, start=8.0, end=9.0), job(2, attempt=2, status="failed", start=4.0, end=4.5),
            job(3, start=1.0, end=2.0), job(4)]
    rows = [
        # Job 1: a lease lost to a reclaim (ended at its lease's end, 5.0,
        # although the frozen worker learnt it at 9.5), then a release.
        row(1, 1, "lease_lost", 0.0, 5.0), row(1, 1, "fence_rejected", 0.2, 9.5),
        row(1, 2, "released", 5.5, 7.0),
        # Job 2: an error and a retry, then an error that failed it.
        row(2, 1, "error", 1.0, 3.0), row(2, 2, "error", 4.0, 4.5),
        # Job 3 done at its first attempt after an ambiguous commit: the
        # fence_rejected row of its completing attempt changes nothing.
        row(3, 1, "fence_rejected", 1.0, 6.0),
        row(99, 1, "lease_lost", 0.0, 1.0),   # not asked for
    ]
    held, unplaced = audit_limits.place(jobs, rows, [1, 2, 3])
    assert unplaced == []
    assert [(h.job, h.attempt, h.start, h.end, h.ended) for h in held] == [
        (1, 1, at(0.0), at(5.0), "lease_lost"), (1, 2, at(5.5), at(7.0), "released"),
        (1, 3, at(8.0), at(9.0), "done"),
        (2, 1, at(1.0), at(3.0), "error"), (2, 2, at(4.0), at(4.5), "error"),
        (3, 1, at(1.0), at(2.0), "done"),
    ]


def test_of_two_ends_of_an_attempt_the_first_counts():
    """Cancelled, then its completion refused: the cancel ended it."""
    held, unplaced = audit_limits.place([job(1, attempt=2, start=5.0, end=6.0)],
                                        [row(1, 1, "released", 0.0, 4.0), row(1, 1, "cancelled", 0.0, 3.0)], [1])
    assert (unplaced, [(h.attempt, h.end, h.ended) for h in held]) == (
        [], [(1, at(3.0), "cancelled"), (2, at(6.0), "done")])


def test_an_attempt_the_history_does_not_place_is_listed():
    jobs = [job(1, attempt=3, start=8.0, end=9.0), job(2, attempt=1, status="running", end=None),
            job(3, attempt=2, status="failed", end=4.0), job(4, attempt=1, status="queued", end=None)]
    rows = [row(1, 2, "fence_rejected", 3.0, 4.0), row(3, 1, "lease_lost", None, 2.0),
            row(3, 2, "lease_lost", 2.5, 3.0)]
    held, unplaced = audit_limits.place(jobs, rows, [1, 2, 3, 4])
    assert [(h.job, h.attempt) for h in held] == [(1, 3), (3, 2)]
    assert unplaced == [
        {"job": 1, "attempt": 1, "why": "no row in pgfence.job_attempts"},
        {"job": 1, "attempt": 2, "why": "no end of its lease in pgfence.job_attempts, only fence_rejected"},
        {"job": 2, "attempt": 1, "why": "still running"},
        {"job": 3, "attempt": 1, "why": "no end of its lease in pgfence.job_attempts, only lease_lost without a "
                                        "start"},
        # Queued again after its first attempt, which left no row.
        {"job": 4, "attempt": 1, "why": "no row in pgfence.job_attempts"},
    ]


# -- the check -------------------------------------------------------------------------------


def limits_check(limits: dict[str, Limit], jobs: list[dict], rows: list[dict], mixes: dict[int, str],
                 keys: dict[int, str] | None = None) -> dict:
    """The check as audit.run makes it from the evidence."""
    ev = audit.Evidence(jobs=jobs, enqueued=mixes, effects={}, receipts={}, deliveries={}, metrics=None,
                        supervisors=[], batch=1, broken=0, db_zero=ZERO, deadlocks=0, limits=limits,
                        keys=keys or {}, attempts=rows)
    return next(c for c in audit.run(ev)["checks"] if c["name"] == "concurrency limits")


def test_a_frozen_attempt_counts_until_its_lease_ended_not_until_it_woke():
    """Limit 2.  Job 1's first attempt was SIGSTOPped: its lease ended at 5,
    a reclaim ran its second attempt from 6 to 8 while job 2 ran from 5 to
    8.  Counted until the frozen worker's fence_rejected at 9, three would
    hold at 6; counted until its lease's end, never more than two."""
    jobs = [job(1, attempt=2, start=6.0, end=8.0), job(2, start=5.0, end=8.0)]
    rows = [row(1, 1, "lease_lost", 0.0, 5.0), row(1, 1, "fence_rejected", 0.1, 9.0)]
    result = limits_check({"limited": Limit(concurrency=2)}, jobs, rows, {1: "limited", 2: "limited"})
    assert result["passed"] is True
    assert result["maxima"] == [{"mix": "limited", "kind": "loadtest_limited_c2", "concurrency": 2,
                                 "per_key_concurrency": None, "keys": 0, "attempts": 3, "max_concurrent": 2,
                                 "max_concurrent_at": 6.0}]
    assert result["over"] == [] and result["unplaced_count"] == 0
    assert result["detail"] == ("limited (loadtest_limited_c2): at most 2 at once (limit 2); "
                                "3 attempt(s) placed, 0 not")
    # Had the lease run on until 9 (the reclaim came after the worker woke,
    # which the fence forbids): three at once, and the check fails.
    rows[0] = row(1, 1, "lease_lost", 0.0, 9.0)
    assert limits_check({"limited": Limit(concurrency=2)}, jobs, rows, {1: "limited", 2: "limited"})["passed"] is False


def test_more_attempts_at_once_than_the_limit_fail_the_check_and_name_the_holders():
    jobs = [job(1, start=0.0, end=3.0), job(2, start=1.0, end=4.0), job(3, start=3.0, end=5.0),
            job(4, start=2.5, end=2.5), job(5, start=9.0, end=9.5)]
    mixes = {1: "limited", 2: "limited", 3: "limited", 4: "limited", 5: "noop"}
    result = limits_check({"limited": Limit(concurrency=2)}, jobs, [], mixes)
    assert result["passed"] is False
    assert result["over"] == [{
        "mix": "limited", "kind": "loadtest_limited_c2", "scope": "kind", "key": None, "limit": 2, "max": 3,
        "at": 2.5, "holders": [
            {"job": 1, "attempt": 1, "start": 0.0, "end": 3.0, "ended": "done"},
            {"job": 2, "attempt": 1, "start": 1.0, "end": 4.0, "ended": "done"},
            {"job": 4, "attempt": 1, "start": 2.5, "end": 2.5, "ended": "done"}]}]
    assert result["maxima"][0]["max_concurrent"] == 3 and result["maxima"][0]["attempts"] == 4
    assert result["detail"] == ("OVER THE LIMIT: limited 3 at once at 2.500s (limit 2); limited "
                                "(loadtest_limited_c2): at most 3 at once (limit 2); 4 attempt(s) placed, 0 not")
    # At the limit is within it.
    assert limits_check({"limited": Limit(concurrency=3)}, jobs, [], mixes)["passed"] is True


def test_a_per_key_limit_is_checked_key_by_key():
    """Per key 1 over two keys, and 3 of the kind at once: k0 had two
    attempts at once (jobs 1 and 3), k1 one at a time, the kind three."""
    keyed = Limit(concurrency=3, per_key=1, keys=2)
    jobs = [job(1, start=0.0, end=2.0), job(2, start=0.5, end=3.0), job(3, start=1.0, end=1.5),
            job(4, start=3.0, end=4.0)]
    keys = {1: "k0", 2: "k1", 3: "k0", 4: "k1"}
    result = limits_check({"keyed": keyed}, jobs, [], dict.fromkeys(keys, "keyed"), keys)
    assert result["passed"] is False
    assert result["maxima"] == [{"mix": "keyed", "kind": "loadtest_keyed_c3_p1", "concurrency": 3,
                                 "per_key_concurrency": 1, "keys": 2, "attempts": 4, "max_concurrent": 3,
                                 "max_concurrent_at": 1.0, "max_per_key": 2, "max_per_key_key": "k0",
                                 "max_per_key_at": 1.0, "keys_used": 2}]
    assert [(o["scope"], o["key"], o["max"], o["at"], [h["job"] for h in o["holders"]]) for o in result["over"]] == [
        ("key", "k0", 2, 1.0, [1, 3])]
    # Job 3 a key of its own: one per key, and the kind's three allowed.
    keys[3] = "k2"
    result = limits_check({"keyed": keyed}, jobs, [], dict.fromkeys(keys, "keyed"), keys)
    assert (result["passed"], result["maxima"][0]["max_per_key"], result["over"]) == (True, 1, [])
    # A kind limit of 2 is exceeded by the same attempts.
    result = limits_check({"keyed": Limit(concurrency=2, per_key=1, keys=3)}, jobs, [],
                          dict.fromkeys(keys, "keyed"), keys)
    assert [(o["scope"], o["max"], o["limit"]) for o in result["over"]] == [("kind", 3, 2)]


def test_an_unplaced_attempt_fails_the_check():
    result = limits_check({"limited": Limit(concurrency=2)}, [job(1, attempt=2, start=3.0, end=4.0)], [],
                          {1: "limited"})
    assert (result["passed"], result["over"], result["unplaced_count"]) == (False, [], 1)
    assert result["unplaced"] == [{"job": 1, "attempt": 1, "why": "no row in pgfence.job_attempts"}]
    assert result["detail"].endswith("; 1 attempt(s) placed, 1 not")


def test_without_limited_mixes_there_is_no_such_check():
    ev = audit.Evidence(jobs=[job(1)], enqueued={1: "noop"}, effects={}, receipts={}, deliveries={}, metrics=None,
                        supervisors=[], batch=1, broken=0, db_zero=ZERO, deadlocks=0)
    assert "concurrency limits" not in [c["name"] for c in audit.run(ev)["checks"]]


# -- the mix ---------------------------------------------------------------------------------


def test_the_mix_grammar_gives_each_limited_mix_its_limits():
    weights, limits = mix.parse_mix("noop=40, limited=20@3,keyed=20@1/50")
    assert weights == {"noop": 40, "limited": 20, "keyed": 20}
    assert limits == {"limited": Limit(concurrency=3), "keyed": Limit(per_key=1, keys=50)}
    assert mix.parse_mix("keyed=5@4:2/7")[1] == {"keyed": Limit(concurrency=4, per_key=2, keys=7)}
    assert mix.parse("noop=1,limited=2@1") == {"noop": 1, "limited": 2}
    assert [Limit(concurrency=3).kind("limited"), Limit(per_key=1, keys=50).kind("keyed"),
            Limit(concurrency=4, per_key=2, keys=7).kind("keyed")] == [
        "loadtest_limited_c3", "loadtest_keyed_p1", "loadtest_keyed_c4_p2"]
    text = mix.encode({"limited": Limit(concurrency=3), "keyed": Limit(concurrency=4, per_key=2, keys=7)})
    assert text == "loadtest_keyed_c4_p2=4/2,loadtest_limited_c3=3/"
    assert mix.decode(text) == [("loadtest_keyed_c4_p2", 4, 2), ("loadtest_limited_c3", 3, None)]
    assert mix.decode("") == []


def test_limited_jobs_get_their_kind_their_keys_in_turn_and_their_seconds_like_sleep():
    limits = {"limited": Limit(concurrency=3), "keyed": Limit(per_key=1, keys=4)}
    counts = mix.allocate(100, {"limited": 1, "keyed": 1})
    assert counts == {**dict.fromkeys(mix.KINDS, 0), "limited": 50, "keyed": 50}
    specs = mix.make_jobs(counts, random.Random(3), sleep_mean=0.2, sleep_max=1.0, limits=limits)
    assert {(s.mix, s.kind) for s in specs} == {("limited", "loadtest_limited_c3"), ("keyed", "loadtest_keyed_p1")}
    assert {s.concurrency_key for s in specs if s.mix == "limited"} == {None}
    keyed = [s for s in specs if s.mix == "keyed"]
    assert sorted((k, sum(1 for s in keyed if s.concurrency_key == k)) for k in {s.concurrency_key for s in keyed}
                  ) == [("k0", 13), ("k1", 13), ("k2", 12), ("k3", 12)]
    assert all(s.payload["key"] == s.concurrency_key for s in keyed)
    assert all(0 <= s.payload["seconds"] <= 1.0 for s in specs)
    assert {(s.max_attempts, s.max_reclaims) for s in specs} == {(10, 8)}
    assert mix.handler_modules({"noop": 1, "limited": 1})[-1] == "pgfence.tools.loadtest.handlers"
    assert "pgfence.tools.loadtest.handlers" not in mix.handler_modules({"noop": 1, "limited": 0})


def test_the_handlers_module_declares_each_kind_with_its_limits():
    from pgfence import registry
    from pgfence.tools.loadtest import handlers

    assert handlers.register("loadtest_keyed_c4_p2=4/2,loadtest_limited_c3=3/") == [
        "loadtest_keyed_c4_p2", "loadtest_limited_c3"]
    specs = {s.kind: s for s in registry.specs()}
    assert (specs["loadtest_keyed_c4_p2"].concurrency, specs["loadtest_keyed_c4_p2"].per_key_concurrency) == (4, 2)
    assert (specs["loadtest_limited_c3"].concurrency, specs["loadtest_limited_c3"].per_key_concurrency) == (3, None)
    assert specs["loadtest_limited_c3"].func is handlers.limited


@pytest.mark.parametrize("value, message", [
    ("limited=20", "'limited' needs its limits: limited=WEIGHT@N"),
    ("limited=20@0", "the concurrency of 'limited' must be from 1 to 2147483647, got 0"),
    ("limited=20@x", "the concurrency of 'limited' must be a whole number, got 'x' (limited=WEIGHT@N)"),
    ("keyed=20@1", "'keyed' needs its per-key limit and its keys: keyed=WEIGHT@N/KEYS or "
                   "keyed=WEIGHT@TOTAL:N/KEYS, got '1'"),
    ("keyed=20@1/0", "the keys of 'keyed' must be from 1 to 1000000, got 0"),
    ("keyed=20@0:1/5", "the concurrency of 'keyed' must be from 1 to 2147483647, got 0"),
    ("noop=3@2", "'noop' takes no limits (only limited and keyed do)"),
    ("limited=x@2", "the weight of 'limited' must be a whole number, got 'x'"),
])
def test_bad_limits_in_the_mix_are_one_line_and_exit_2(value, message):
    proc = pgfence("loadtest", "--mix", value, timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"pgfence: error: invalid --mix: {message}\n")


# -- real runs -------------------------------------------------------------------------------

#: The attempts of the run's limited jobs placed as the audit places them,
#: in SQL, and per kind (and per key) the most that hold one instant.
PEAKS = """
WITH iv AS (
    SELECT kind, payload->>'key' AS key, tstzrange(started_at, finished_at, '[)') AS r
      FROM pgfence.all_jobs WHERE queue = %(queue)s AND status = 'done'
    UNION ALL
    SELECT j.kind, j.payload->>'key', tstzrange(min(a.started_at), min(a.ended_at), '[)')
      FROM pgfence.job_attempts a JOIN pgfence.all_jobs j ON j.id = a.job_id
     WHERE j.queue = %(queue)s AND a.outcome <> 'fence_rejected'
     GROUP BY j.id, j.kind, j.payload, a.attempt
)
SELECT x.kind, count(*),
       max((SELECT count(*) FROM iv y WHERE y.kind = x.kind AND y.r @> lower(x.r))),
       max((SELECT count(*) FROM iv y WHERE y.kind = x.kind AND y.key = x.key AND y.r @> lower(x.r)))
  FROM iv x GROUP BY x.kind ORDER BY x.kind
"""


@pytest.mark.timeout(120)
def test_a_limited_mix_under_faults_never_runs_past_its_limits(backend, dsn, conn):
    """SIGSTOPs, SIGKILLs, partitions and terminated connections while
    limited jobs run: the report's maxima are within the limits, equal to
    the database's own count, and the audit passes."""
    from test_loadtest import FIRST_BACKEND, failed_checks, loadtest

    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc, report = loadtest("--jobs", "100", "--supervisors", "2", "--workers", "3", "--lease", "2",
                            "--mix", "limited=50@2,keyed=50@3:1/3", "--sleep-mean", "0.3", "--sleep-max", "1",
                            "--faults", "stop,kill,partition,terminate", "--fault-interval", "1.2", "--seed", "41",
                            "--timeout", "80", "--json", dsn=dsn)
    assert failed_checks(report) == [], json.dumps(report["audit"], indent=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["summary"]["by_mix"] == {"limited": {"count": 50, "expected": "done", "states": {"done": 50}},
                                           "keyed": {"count": 50, "expected": "done", "states": {"done": 50}}}
    assert report["config"]["limits"] == {
        "limited": {"kind": "loadtest_limited_c2", "concurrency": 2, "per_key_concurrency": None, "keys": 0},
        "keyed": {"kind": "loadtest_keyed_c3_p1", "concurrency": 3, "per_key_concurrency": 1, "keys": 3}}
    assert all(report["faults"]["injected"][f] >= 1 for f in ("stop", "kill", "partition", "terminate"))
    check = next(c for c in report["audit"]["checks"] if c["name"] == "concurrency limits")
    assert (check["passed"], check["over"], check["unplaced_count"]) == (True, [], 0)
    assert report["limits"] == check["maxima"]
    keyed, limited = report["limits"]
    assert (keyed["mix"], limited["mix"]) == ("keyed", "limited")
    assert 1 <= limited["max_concurrent"] <= 2 and "max_per_key" not in limited
    assert 1 <= keyed["max_concurrent"] <= 3 and keyed["max_per_key"] == 1 and keyed["keys_used"] == 3
    # The database counts the same, by its own ranges.
    peaks = conn.execute(PEAKS, {"queue": report["queue"]}).fetchall()
    assert peaks == [("loadtest_keyed_c3_p1", keyed["attempts"], keyed["max_concurrent"], 1),
                     ("loadtest_limited_c2", limited["attempts"], limited["max_concurrent"], 0)]
    # The faults took attempts of limited jobs away (a lease lost to a
    # reclaim, a release after a killed worker), and still within limits.
    lost = scalar(conn, "SELECT count(*) FROM pgfence.job_attempts a JOIN pgfence.all_jobs j ON j.id = a.job_id "
                        "WHERE j.queue = %s AND a.outcome IN ('lease_lost', 'released')", (report["queue"],))
    assert lost >= 1
    # The limits the workers declared, as the mix gave them.
    assert conn.execute("SELECT kind, declared_concurrency, declared_per_key, set_concurrency, set_per_key "
                        "FROM pgfence.limits ORDER BY kind").fetchall() == [
        ("loadtest_keyed_c3_p1", 3, 1, None, None), ("loadtest_limited_c2", 2, None, None, None)]


@pytest.mark.timeout(120)
def test_a_limit_raised_behind_the_runs_back_fails_its_audit(backend, dsn, conn):
    """`limited=1@1`, and once its first job runs the limit is set to 4 at
    run time: more than one job runs at once, the audit names them and the
    run exits 1, every other check passing."""
    from test_loadtest import FIRST_BACKEND

    from pgfence.admin import limits as admin_limits

    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    proc = spawn("loadtest", "--jobs", "16", "--supervisors", "1", "--workers", "4", "--mix", "limited=1@1",
                 "--sleep-mean", "0.4", "--sleep-max", "0.8", "--faults", "none", "--seed", "42", "--timeout", "60",
                 "--json", dsn=dsn)
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE kind = 'loadtest_limited_c1' "
                                      "AND status = 'running'") == 1
                 and scalar(conn, "SELECT count(*) FROM pgfence.jobs WHERE kind = 'loadtest_limited_c1' "
                                  "AND held_back = 'concurrency'") >= 10,
                 timeout=40, message="the first limited job running, the others held back")
        admin_limits.set_limits(conn, "loadtest_limited_c1", concurrency=4)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    report = json.loads(out)
    assert proc.returncode == 1, err[-2000:]
    assert report["audit"]["passed"] is False
    assert [c["name"] for c in report["audit"]["checks"] if not c["passed"]] == ["concurrency limits"]
    check = next(c for c in report["audit"]["checks"] if c["name"] == "concurrency limits")
    assert check["unplaced_count"] == 0 and len(check["over"]) == 1
    over = check["over"][0]
    assert (over["mix"], over["kind"], over["scope"], over["limit"]) == ("limited", "loadtest_limited_c1", "kind", 1)
    assert 2 <= over["max"] <= 4 and len(over["holders"]) == over["max"]
    assert report["limits"][0]["max_concurrent"] == over["max"]
    assert check["detail"].startswith(f"OVER THE LIMIT: limited {over['max']} at once at ")
    # The holders named ran at once by the database's own record.
    ids = [h["job"] for h in over["holders"]]
    rows = conn.execute("SELECT started_at, finished_at FROM pgfence.all_jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    assert len(rows) == over["max"]
    assert max(s for s, _f in rows) < min(f for _s, f in rows)


@pytest.mark.timeout(90)
def test_a_limit_set_at_run_time_on_a_limited_kind_refuses_the_run(backend, dsn, conn):
    """A run-time limit wins over the handlers' declaration until reset: the
    run would not test the mix's limit, so it stops before enqueueing."""
    from test_loadtest import FIRST_BACKEND

    from pgfence.admin import limits as admin_limits

    if backend[0] != FIRST_BACKEND:
        pytest.skip(f"one backend is enough; it runs on {FIRST_BACKEND}")
    admin_limits.set_limits(conn, "loadtest_limited_c1", concurrency=4)
    proc = pgfence("loadtest", "--jobs", "4", "--supervisors", "1", "--workers", "1", "--mix", "limited=1@1",
                   "--seed", "43", "--timeout", "30", dsn=dsn, timeout=80)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("pgfence: error: kind 'loadtest_limited_c1' runs under limits concurrency 4, per key "
                           "none, not the mix's concurrency 1, per key none: reset them with 'pgfence limits reset "
                           "loadtest_limited_c1'\n")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0
    assert conn.execute("SELECT declared_concurrency, set_concurrency FROM pgfence.limits "
                        "WHERE kind = 'loadtest_limited_c1'").fetchone() == (1, 4)
