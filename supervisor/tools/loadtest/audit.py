"""The audit at the end of a load test: the database, the email API's log and
the supervisors' counters must tell one consistent story.

Checked exactly:

- every job enqueued is in the run's queue and nothing else is; none is
  queued or running; each ended in the state its mix implies (noop, sleep,
  effect, receipt, asleep, aeffect: done; fail: failed);
- no effect and no receipt row committed twice (``pgfence_examples.effects`` and
  ``pgfence_examples.receipts`` grouped by job), and every done effect,
  aeffect (the async effect, same table) or receipt job has its one row;
- the email API saw exactly one distinct idempotency key per receipt job that
  sent (none other), each at most as many times as the job was claimed
  (``attempt``): every attempt posts at most once;
- every supervisor ran until it was stopped and then exited 0;
- with limited mixes (``limited``, ``keyed``): no instant saw more attempts
  of such a kind, or of one of its concurrency keys, holding a live lease
  than its limit, from the attempt history (:mod:`.audit_limits`).

The counters against the database.  From ``sql/queries/jobs.sql``, a job's
``reclaims`` is raised by exactly two statements, by one each time:

- ``claim``, for every row it takes whose ``prev_status`` is ``running`` (an
  expired lease), whether the verdict is a new attempt or ``failed``; the
  worker counts each such returned row in ``pgfence_reclaims_total``;
- ``release`` with ``reclaim = true``, issued only by the heartbeat manager
  for a child that died unplanned (``ORPHANED_CRASH``), for every lease the
  child held; counted in
  ``pgfence_jobs_released_total`` together with shutdown releases, so it
  cannot be told apart there.

(``retry_ids``/``retry_failed`` reset it; a load test never calls them.)  So
``R = sum(jobs.reclaims) = claim reclaims + death releases``.  A counter is
incremented only after its statement committed and answered, so
``reclaims_total <= claim reclaims <= R``.  The difference ``R -
reclaims_total`` is made of death releases, at most ``held`` per unplanned
child death (``pgfence_worker_restarts_total``, counted by the arbiter,
which no fault touches), and of claims that committed but whose answer never
arrived, at most ``batch`` (one claim's size) per worker connection broken
by a fault: every backend ended by ``terminate``, and for each server
restart every worker connection (S x N x the connections of one worker).
``held`` is the most leases one child holds at once: ``batch`` for a child
that runs one job at a time; for one that runs many (threads, an event
loop), its capacity in flight plus as many ended and not yet completed,
twice its capacity (a SIGKILL of such a child hits all of them).  A child
killed after its claim committed loses either the release or the count, not
both.  Hence, with ``broken`` those connections::

    R - (held * restarts_total + batch * broken) <= reclaims_total <= R

which is an equality when no worker died and no connection was broken.

``pgfence_double_run_prevented_total`` counts completions and failure
reports the fence refused, at most one per attempt.  An attempt is refused
only when the job is no longer its own: a newer attempt exists, or a claim
failed the job (``lease expired on the final attempt``, ``quarantined``,
``no attempts left``: the job keeps that attempt number), or the attempt's
own commit went through while the connection broke before the answer came,
so the worker reported an error on a new connection and the fence refused
that report (an ambiguous commit, at most ``held`` per broken connection:
one batched completion carries at most the jobs a child holds).  Hence::

    double_run_prevented_total <= sum(attempt - 1) + failed_at_claim + held * broken

and, when no connection was broken and ``R == 0`` (no job changed hands),
``double_run_prevented_total == 0``.  Finally each lease lost with reason
``fence_rejected`` is counted together with a prevented double run, so
``lease_lost_total{reason="fence_rejected"} <= double_run_prevented_total``.

The checks above forbid a double commit; they allow work to be done again.
So, per job, from the database: a job changed hands (``reclaims`` above 0)
or ran a second attempt although its handler does not raise (every mix but
``fail``) only because of a fault.  Such a job's last claim (``started_at``,
or ``finished_at`` when the claim failed it) must fall in the window of a
fault injected at that time: from the fault to its end (a stop or a
partition lasts ``seconds``) plus three leases and ``FAULT_SLACK`` (a lease
to run out, a heartbeat round, a reclaim scan, a child's respawn).  The
window is by time, not by target: a fault on a child that runs many jobs
at once (a SIGSTOP, a SIGKILL) hits every job it holds, and each of them is
inside that fault's window whichever job the title named.  In a run
without faults no job may change hands or run again unless it raised, and
PostgreSQL must have detected no deadlock in the database
(``pg_stat_database.deadlocks`` unchanged): a deadlock is a defect in the
lock order of pgfence's statements, and each one sends jobs back to run
again once their leases run out.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pgfence.job import idempotency_key
from pgfence.tools.loadtest import audit_limits
from pgfence.tools.loadtest.mix import EFFECTS, EXPECTED, Limit

#: Verdicts the claim statement writes when it fails a job instead of running it.
CLAIM_VERDICTS = ("lease expired on the final attempt", "quarantined:", "no attempts left")
#: Offending jobs listed per check (the counts are always complete).
LIST_LIMIT = 50
#: Mixes whose handler raises on purpose: their second attempt is a retry.
RAISES = frozenset({"fail"})
#: Seconds past a fault's end plus three leases in which it may still send a
#: job to a new attempt.
FAULT_SLACK = 10.0


@dataclass
class Evidence:
    """Everything the audit looks at, gathered by the runner."""

    jobs: list[dict[str, Any]]                       # the queue's rows
    enqueued: dict[int, str]                         # job id -> mix name
    effects: dict[int, list[dict[str, Any]]]         # job id -> rows, in id order
    receipts: dict[int, list[dict[str, Any]]]
    deliveries: dict[str, int]                       # idempotency key -> requests
    metrics: dict[str, Any] | None                   # summed counters, None if a scrape failed
    supervisors: list[dict[str, Any]]                # index, exit_status, exited_early, scraped
    batch: int                                       # most jobs one claim takes
    broken: int                                      # worker connections a fault may have broken
    faults: dict[str, int] = field(default_factory=dict)
    #: The faults injected, as Faults.events: "t" in seconds from db_zero.
    fault_events: list[dict[str, Any]] = field(default_factory=list)
    lease: float = 30.0
    db_zero: dt.datetime | None = None               # the database clock when the faults' clock started
    deadlocks: int | None = None                     # pg_stat_database.deadlocks after - before
    #: `--unprotected`: the supervisors renew no lease, so a handler that
    #: runs longer than its lease is reclaimed by design, fault or not.
    unprotected: bool = False
    #: Most leases one worker child holds at once (0: ``batch``, a child
    #: that runs one job at a time).
    held: int = 0
    #: The limited mixes' limits, by mix name (none: no such check).
    limits: dict[str, Limit] = field(default_factory=dict)
    #: Job id -> its concurrency key (the keyed mix's jobs).
    keys: dict[int, str] = field(default_factory=dict)
    #: The limited jobs' rows of pgfence.job_attempts (statements.Attempt).
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def per_child(self) -> int:
        return max(self.batch, self.held)


def _check(name: str, passed: bool, detail: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail, **extra}


def run(ev: Evidence) -> dict[str, Any]:
    checks = [
        _ended(ev), _accounted(ev), _final_states(ev),
        _once(ev, "effects", ev.effects, EFFECTS), _once(ev, "receipts", ev.receipts, ("receipt",)),
        _deliveries(ev), *_counters(ev), _extra_attempts(ev), _deadlocks(ev), _supervisors(ev),
    ]
    if ev.limits:
        checks.append(audit_limits.check(ev.limits, ev.enqueued, ev.keys, ev.jobs, ev.attempts, ev.db_zero))
    return {"passed": all(c["passed"] for c in checks), "checks": checks}


def _ended(ev: Evidence) -> dict[str, Any]:
    states = Counter(j["status"] for j in ev.jobs)
    live = states.get("queued", 0) + states.get("running", 0)
    return _check("every job ended", live == 0,
                  f"{states.get('queued', 0)} queued, {states.get('running', 0)} running", states=dict(states))


def _accounted(ev: Evidence) -> dict[str, Any]:
    found = {j["id"] for j in ev.jobs}
    missing = sorted(set(ev.enqueued) - found)
    extra = sorted(found - set(ev.enqueued))
    return _check("every job accounted for", not missing and not extra,
                  f"{len(ev.enqueued)} enqueued, {len(found)} in the queue, {len(missing)} missing, "
                  f"{len(extra)} unknown", missing=missing[:LIST_LIMIT], unknown=extra[:LIST_LIMIT])


def _final_states(ev: Evidence) -> dict[str, Any]:
    wrong = [{"job": j["id"], "mix": ev.enqueued[j["id"]], "status": j["status"], "attempt": j["attempt"],
              "last_error": j["last_error"]}
             for j in ev.jobs if j["id"] in ev.enqueued and j["status"] != EXPECTED[ev.enqueued[j["id"]]]]
    return _check("final state per mix", not wrong, f"{len(wrong)} job(s) not in the state their mix implies",
                  wrong=wrong[:LIST_LIMIT], wrong_count=len(wrong))


def _once(ev: Evidence, table: str, rows: dict[int, list[dict[str, Any]]],
          mix_names: tuple[str, ...]) -> dict[str, Any]:
    duplicates = [{"job": job_id, "rows": [r["id"] for r in rs], "attempts": [r["attempt"] for r in rs],
                   **({"workers": [r["worker"] for r in rs]} if table == "effects" else {})}
                  for job_id, rs in sorted(rows.items()) if len(rs) > 1]
    done = {j["id"] for j in ev.jobs if ev.enqueued.get(j["id"]) in mix_names and j["status"] == "done"}
    missing = sorted(done - set(rows))
    return _check(f"{table} committed once", not duplicates and not missing,
                  f"{len(duplicates)} job(s) with more than one row, {len(missing)} done job(s) without one",
                  duplicates=duplicates, missing=missing[:LIST_LIMIT])


def _deliveries(ev: Evidence) -> dict[str, Any]:
    receipt_jobs = {j["id"]: j for j in ev.jobs if ev.enqueued.get(j["id"]) == "receipt"}
    keys = {idempotency_key(job_id): j for job_id, j in receipt_jobs.items()}
    over = [{"job": j["id"], "requests": ev.deliveries[k], "attempt": j["attempt"]}
            for k, j in sorted(keys.items(), key=lambda kv: kv[1]["id"])
            if ev.deliveries.get(k, 0) > j["attempt"]]
    unknown = sorted(k for k in ev.deliveries if k not in keys)
    unsent = sorted(j["id"] for k, j in keys.items() if j["status"] == "done" and ev.deliveries.get(k, 0) == 0)
    sent = sum(1 for k in keys if k in ev.deliveries)
    return _check("email deliveries", not over and not unknown and not unsent,
                  f"{sent} distinct key(s) for {len(keys)} receipt job(s), {sum(ev.deliveries.values())} request(s); "
                  f"{len(over)} key(s) seen more often than claimed, {len(unknown)} unknown key(s), "
                  f"{len(unsent)} done job(s) never sent",
                  over=over[:LIST_LIMIT], unknown=unknown[:LIST_LIMIT], unsent=unsent[:LIST_LIMIT])


def database_totals(ev: Evidence) -> dict[str, int]:
    failed_at_claim = sum(1 for j in ev.jobs if j["status"] == "failed"
                          and (j["last_error"] or "").startswith(CLAIM_VERDICTS))
    return {
        "reclaims": sum(j["reclaims"] for j in ev.jobs),
        "attempts": sum(j["attempt"] for j in ev.jobs),
        "extra_attempts": sum(max(0, j["attempt"] - 1) for j in ev.jobs),
        "failed_at_claim": failed_at_claim,
    }


def _counters(ev: Evidence) -> list[dict[str, Any]]:
    if ev.metrics is None:
        return [_check("counters scraped", False, "the metrics of at least one supervisor could not be scraped")]
    db = database_totals(ev)
    m = ev.metrics
    reclaims, restarts, prevented = m["reclaims_total"], m["worker_restarts_total"], m["double_run_prevented_total"]
    r = db["reclaims"]
    held = ev.per_child
    slack = held * restarts + ev.batch * ev.broken
    low = r - slack
    checks = [_check(
        "reclaims counter", low <= reclaims <= r,
        f"pgfence_reclaims_total {reclaims:g}; sum(jobs.reclaims) {r}; allowed {max(0, low):g}..{r} "
        f"(held {held} x {restarts:g} worker restarts + batch {ev.batch} x {ev.broken} broken connections)",
        counter=reclaims, database=r, low=low, high=r)]
    bound = db["extra_attempts"] + db["failed_at_claim"] + held * ev.broken
    ok = prevented <= bound
    detail = (f"pgfence_double_run_prevented_total {prevented:g} <= sum(attempt - 1) {db['extra_attempts']} "
              f"+ failed at claim {db['failed_at_claim']} + held x broken connections {held * ev.broken} "
              f"= {bound}")
    if ev.broken == 0 and r == 0:
        ok = ok and prevented == 0
        detail += "; no job changed hands and no connection was broken, so it must be 0"
    checks.append(_check("double runs prevented", ok, detail, counter=prevented, bound=bound))
    fence_lost = m["lease_lost_total"].get("fence_rejected", 0)
    checks.append(_check("fence_rejected leases", fence_lost <= prevented,
                         f"pgfence_lease_lost_total{{reason=fence_rejected}} {fence_lost:g} <= "
                         f"double runs prevented {prevented:g}"))
    return checks


def fault_free(ev: Evidence) -> bool:
    return not ev.fault_events and ev.broken == 0


def fault_windows(ev: Evidence) -> list[tuple[float, float, str]]:
    """(start, end, fault) in seconds from db_zero: when each fault injected
    may have sent jobs to a new attempt."""
    return [(e["t"], e["t"] + float(e.get("seconds") or 0.0) + 3 * ev.lease + FAULT_SLACK, e["fault"])
            for e in ev.fault_events]


def _extra_attempts(ev: Evidence) -> dict[str, Any]:
    windows = fault_windows(ev)
    disturbed, explained, unexplained = 0, 0, []
    for j in ev.jobs:
        mix_name = ev.enqueued.get(j["id"])
        if mix_name is None:
            continue
        if not (j["reclaims"] > 0 or (j["attempt"] > 1 and mix_name not in RAISES)):
            continue
        disturbed += 1
        at_claim = j["status"] == "failed" and (j["last_error"] or "").startswith(CLAIM_VERDICTS)
        when = j["finished_at"] if at_claim else j["started_at"]
        t = (when - ev.db_zero).total_seconds() if when is not None and ev.db_zero is not None else None
        if ev.unprotected or (t is not None and any(start <= t <= end for start, end, _ in windows)):
            explained += 1
            continue
        unexplained.append({"job": j["id"], "mix": mix_name, "attempt": j["attempt"], "reclaims": j["reclaims"],
                            "status": j["status"], "last_claim_at": None if t is None else round(t, 3),
                            "last_error": j["last_error"]})
    what = "no fault was injected" if fault_free(ev) else f"{len(windows)} fault(s) injected"
    if ev.unprotected:
        what += "; unprotected: no lease is renewed, so each is explained"
    return _check("extra attempts explained", not unexplained,
                  f"{disturbed} job(s) reclaimed or run again without their handler raising, {explained} of them "
                  f"in the window of a fault, {len(unexplained)} not ({what})",
                  unexplained=unexplained[:LIST_LIMIT], unexplained_count=len(unexplained))


def _deadlocks(ev: Evidence) -> dict[str, Any]:
    if ev.deadlocks is None:
        return _check("no deadlocks", True, "pg_stat_database.deadlocks not read")
    if fault_free(ev):
        return _check("no deadlocks", ev.deadlocks == 0,
                      f"pg_stat_database.deadlocks rose by {ev.deadlocks} during the run (no fault injected: "
                      "must be 0)", deadlocks=ev.deadlocks)
    return _check("no deadlocks", True, f"pg_stat_database.deadlocks rose by {ev.deadlocks} during the run "
                  "(faults injected: reported only)", deadlocks=ev.deadlocks)


def _supervisors(ev: Evidence) -> dict[str, Any]:
    bad = [s for s in ev.supervisors if s["exited_early"] or s["exit_status"] != 0 or not s["scraped"]]
    return _check("supervisors", not bad,
                  f"{len(ev.supervisors)} supervisor(s), {len(bad)} that stopped on their own, exited non-zero or "
                  "could not be scraped", bad=bad)
