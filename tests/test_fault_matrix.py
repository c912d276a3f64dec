"""One fault matrix for every mode of the worker engine: real ``pgfence run``
supervisors, real signals, a real proxy partition, real PostgreSQL.

Modes (how the supervisors run, and which kinds the jobs are):

- ``loop``: the one-job loop (``--threads 1``, a def-only module), two
  children per supervisor;
- ``threads``: one child of four threads (def-only module);
- ``async``: one child, an event loop of 8 slots (async-only module);
- ``mixed-def``, ``mixed-async``, ``mixed-both``: one child of a module with
  def and async def handlers (four threads and 8 loop slots), running jobs of
  its def kind, of its async kind, or of both at once.

Faults, each injected while the jobs run (attempt 1) in supervisor A and a
second supervisor B, started after A took every job, stands idle:

- ``stop-child``: SIGSTOP of the child that holds the first job, kept past
  its lease until B has reclaimed the child's jobs; resumed, the child's
  stale completions must be refused by the fence (one refusal each);
- ``kill-child``: SIGKILL of that child (its jobs released at once);
- ``kill-arbiter``: SIGKILL of A's arbiter (its children and heartbeat get
  SIGTERM; nobody renews A's leases; B reclaims; A's late completions are
  refused);
- ``stop-renewal``: SIGSTOP of A's renewal (heartbeat) process until B has
  reclaimed A's jobs, then SIGCONT;
- ``outage``: A talks to PostgreSQL through the load test's proxy, whose link
  is cut (blackholed) until B has reclaimed A's jobs, then healed;
- ``hang``: the first job's handler hangs past its 1 s timeout (a thread that
  sleeps; an await the timeout cancels);
- ``block-loop``: the first async job blocks its event loop for 3 s, past its
  1 s timeout (for def-only modes, and the mixed module running def jobs
  only, there is no loop to block: not applicable, see CASES).

Invariants checked in every case:

1. nothing lost: every job ends ``done`` (``pgfence.all_jobs``);
2. exactly one committed effect per job, that of its last attempt;
3. no job is left running with a lease that ran out more than lease + 2 s
   ago (sampled all along) while B is idle;
4. no unexplained attempt: a job the fault hit has attempt 2 (reclaims 1
   when its lease was lost, 0 for a timeout, with its ``timed out`` error),
   every other job attempt 1, reclaims 0;
5. ``pgfence_double_run_prevented_total``, summed over the multiprocess
   metric files of both supervisors (``--metrics-dir`` in the tmp folder,
   left on disk by a SIGKILLed arbiter), equals the ``fence_rejected`` rows
   of ``pgfence.job_attempts``; refusals come only from the attempts the
   fault hit, and for the faults that leave a stale attempt running to its
   end (every lease fault but kill-child), exactly one per job hit.

``FAST`` is the default suite's subset (one case per fault, every mode at
least once); the rest is marked slow.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtools import state, wait_for
from supervisors import Supervisor, supervisor_fixture

SYNC, ASYNC, MIXED = "matrix_sync_handlers", "matrix_async_handlers", "matrix_mixed_handlers"

#: Every kind's lease (renewed each half second).
LEASE = 1.5
#: How long after its lease ran out a job may stay running while B is idle.
STALE_AFTER = LEASE + 2.0

#: mode -> (supervisor options, the kinds of its jobs).
MODES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "loop": ({"handlers": SYNC, "workers": 2, "threads": 1}, ["m_def", "m_def"]),
    "threads": ({"handlers": SYNC, "workers": 1, "threads": 4}, ["m_def"] * 3),
    "async": ({"handlers": ASYNC, "workers": 1, "async_concurrency": 8}, ["m_async"] * 3),
    "mixed-def": ({"handlers": MIXED, "workers": 1, "threads": 4, "async_concurrency": 8}, ["m_def"] * 3),
    "mixed-async": ({"handlers": MIXED, "workers": 1, "threads": 4, "async_concurrency": 8}, ["m_async"] * 3),
    "mixed-both": ({"handlers": MIXED, "workers": 1, "threads": 4, "async_concurrency": 8},
                   ["m_def", "m_async", "m_def", "m_async"]),
}
FAULTS = ("stop-child", "kill-child", "kill-arbiter", "stop-renewal", "outage", "hang", "block-loop")
#: The faults that leave the stale attempt running to its fenced completion.
REFUSED = ("stop-child", "kill-arbiter", "stop-renewal", "outage")
#: The faults after which a job hit is reclaimed (its lease lost) rather
#: than retried (timed out).
LEASE_FAULTS = ("stop-child", "kill-child", "kill-arbiter", "stop-renewal", "outage")

#: One case per fault for the default suite, spread over the modes.
FAST = {("mixed-both", "stop-child"), ("threads", "kill-child"), ("loop", "kill-arbiter"),
        ("async", "stop-renewal"), ("mixed-def", "outage"), ("mixed-async", "hang"),
        ("mixed-both", "block-loop")}
NOT_APPLICABLE = {
    ("loop", "block-loop"): "a def-only module runs no event loop to block (a hung thread is the hang case)",
    ("threads", "block-loop"): "a def-only module runs no event loop to block (a hung thread is the hang case)",
    ("mixed-def", "block-loop"): "def jobs run on threads, not on the loop; a loop blocked while def jobs run "
                                 "is the mixed-both case",
}


def _cases() -> Iterator[Any]:
    for mode in MODES:
        for fault in FAULTS:
            marks: list[pytest.MarkDecorator] = []
            if (mode, fault) in NOT_APPLICABLE:
                marks.append(pytest.mark.skip(reason=f"not applicable: {NOT_APPLICABLE[mode, fault]}"))
            elif (mode, fault) not in FAST:
                marks.append(pytest.mark.slow)
            yield pytest.param(mode, fault, id=f"{mode}-{fault}", marks=marks)


CASES = list(_cases())

supervisors = supervisor_fixture(defaults={"lease": LEASE, "poll_interval": 0.2, "backoff_base": 0.2,
                                           "backoff_max": 0.5})


# -- helpers ------------------------------------------------------------------------


def kinds_for(mode: str, fault: str) -> list[str]:
    """The kinds of the case's jobs: the mode's, with the first job (of
    each sort, in mixed-both) made to hang or to block the loop."""
    kinds = list(MODES[mode][1])
    if fault == "hang":
        for sort in ("m_def", "m_async"):
            if sort in kinds:
                kinds[kinds.index(sort)] = f"{sort}_hang"
    elif fault == "block-loop":
        kinds[kinds.index("m_async")] = "m_async_block"
    return kinds


def payload_for(fault: str) -> str:
    """Attempt 1's work (see tests/matrix_kinds.py): long enough that the
    fault lands mid-run; where the stale attempt goes on by itself (its
    arbiter or renewal gone), longer than its lease plus the reclaim."""
    inside = 6 if fault in ("kill-arbiter", "stop-renewal") else 3
    return f'{{"before": 0.5, "inside": {inside}, "block": 3}}'


def pid_of(locked_by: str | None) -> int | None:
    return int(locked_by.split(":")[1]) if locked_by else None


def jobs(conn: psycopg.Connection) -> dict[int, tuple[str, int, int, int | None]]:
    """id -> (status, attempt, reclaims, pid of the holder)."""
    return {i: (s, a, r, pid_of(w)) for i, s, a, r, w in conn.execute(
        "SELECT id, status, attempt, reclaims, locked_by FROM pgfence.all_jobs ORDER BY id")}


def stale(conn: psycopg.Connection) -> list[tuple[int, int, float]]:
    """(id, attempt, seconds since its lease ran out) of every running job
    whose lease ran out more than STALE_AFTER ago."""
    return [tuple(r) for r in conn.execute(
        "SELECT id, attempt, extract(epoch FROM clock_timestamp() - lease_until)::float8 FROM pgfence.jobs"
        " WHERE status = 'running' AND lease_until < clock_timestamp() - make_interval(secs => %s)",
        (STALE_AFTER,))]


def rejected(conn: psycopg.Connection) -> list[tuple[int, int]]:
    """(job, attempt) of every fence_rejected row of pgfence.job_attempts."""
    return [tuple(r) for r in conn.execute(
        "SELECT job_id, attempt FROM pgfence.job_attempts WHERE outcome = 'fence_rejected' ORDER BY 1, 2")]


def effects(conn: psycopg.Connection) -> dict[int, list[int]]:
    """job -> the attempts of its committed effect rows."""
    out: dict[int, list[int]] = {}
    for job_id, attempt in conn.execute("SELECT job_id, attempt FROM matrix.effects ORDER BY job_id, attempt"):
        out.setdefault(job_id, []).append(attempt)
    return out


def prevented(dirs: list[Path]) -> float:
    """pgfence_double_run_prevented_total summed over the metric files of
    ``dirs`` (every process of every supervisor, dead ones included)."""
    total = 0.0
    for directory in dirs:
        if not any(directory.glob("*.db")):
            continue
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(directory))
        for family in registry.collect():
            total += sum(s.value for s in family.samples if s.name == "pgfence_double_run_prevented_total")
    return total


def via_proxy(dsn: str, port: int) -> str:
    params = conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(port), sslmode="disable")
    return make_conninfo("", **params)


class Watch:
    """Polls with a deadline, sampling invariant 3 at every poll."""

    def __init__(self, conn: psycopg.Connection, sups: list[Supervisor]):
        self.conn = conn
        self.sups = sups
        self.stale: list[tuple[int, int, float]] = []

    def __call__(self, condition: Callable[[], Any], timeout: float, message: str) -> Any:
        def polled() -> Any:
            self.stale.extend(stale(self.conn))
            return condition()

        try:
            return wait_for(polled, timeout=timeout, interval=0.05, message=message)
        except AssertionError as exc:
            logs = "".join(f"\n--- {s.label} log ---\n{s.log()}" for s in self.sups)
            raise AssertionError(f"{exc}\njobs: {jobs(self.conn)}\nrejected: {rejected(self.conn)}{logs}") from None


# -- the matrix -----------------------------------------------------------------------


@pytest.mark.parametrize("mode, fault", CASES)
def test_fault_matrix(dsn, conn, supervisors, tmp_path, mode, fault):
    conn.execute("CREATE SCHEMA matrix")
    conn.execute("CREATE TABLE matrix.effects (job_id bigint, attempt int, pid int, PRIMARY KEY (job_id, attempt))")
    options, _ = MODES[mode]
    kill_after = {"hang": 1, "block-loop": 5}.get(fault, 30)
    dirs = [tmp_path / "metrics-a", tmp_path / "metrics-b"]
    proxy = None
    env_a: dict[str, str] = {}
    if fault == "outage":
        from pgfence.tools.loadtest.proxy import Proxy

        params = conninfo_to_dict(dsn)
        proxy = Proxy((params.get("host", "127.0.0.1"), int(params.get("port", 5432))))
        [port] = proxy.start(1)
        env_a = {"PGFENCE_DSN": via_proxy(dsn, port)}
    try:
        a = supervisors("a", env=env_a, metrics_dir=dirs[0], lost_lease_kill_after=kill_after, **options)
        watch = Watch(conn, [a])
        a.wait_workers(options["workers"], timeout=30)
        kinds = kinds_for(mode, fault)
        ids = [r[0] for r in conn.execute(
            "SELECT pgfence.enqueue(k, %s::jsonb) FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n",
            (payload_for(fault), kinds))]
        children = a.workers()
        held = watch(lambda: all(s == "running" and a_ == 1 and p in children
                                 for s, a_, _r, p in jobs(conn).values()) and jobs(conn),
                     20, "every job running in A's children")
        b = supervisors("b", metrics_dir=dirs[1], lost_lease_kill_after=kill_after, **options)
        watch.sups.append(b)
        b.wait_workers(options["workers"], timeout=30)
        watch(lambda: all(t.endswith(" idle") for t in b.workers().values()), 20, "B's children idle")

        # -- the fault
        target = held[ids[0]][3]
        a.children()                                      # every pid of A seen, for the cleanup
        if fault in ("stop-child", "kill-child"):
            hit = [i for i, (_s, _a, _r, p) in held.items() if p == target]
        elif fault in ("kill-arbiter", "stop-renewal", "outage"):
            hit = list(held)
        else:
            hit = [i for i, k in zip(ids, kinds, strict=True) if k.endswith(("_hang", "_block"))]

        def reclaimed() -> bool:
            now = jobs(conn)
            return all(now[i][1] == 2 for i in hit)

        if fault == "stop-child":
            os.kill(target, signal.SIGSTOP)
            watch(lambda: state(target) == "T", 5, "the child stopped")
            watch(reclaimed, 20, "B's reclaim of the stopped child's jobs")
            assert state(target) == "T"
            os.kill(target, signal.SIGCONT)
        elif fault == "kill-child":
            os.kill(target, signal.SIGKILL)
        elif fault == "kill-arbiter":
            a.signal(signal.SIGKILL)
            assert a.wait_exit(10) == -signal.SIGKILL
        elif fault == "stop-renewal":
            renewal = a.heartbeat()
            assert renewal is not None
            os.kill(renewal, signal.SIGSTOP)
            watch(reclaimed, 20, "B's reclaim of A's jobs while A's renewal process is stopped")
            if a.alive(renewal):
                os.kill(renewal, signal.SIGCONT)
        elif fault == "outage":
            assert proxy is not None
            proxy.partition(0)
            watch(reclaimed, 20, "B's reclaim of A's jobs while A cannot reach the database")
            proxy.heal(0)

        # -- the end: every job done, every refusal counted
        expected_refused = sorted((i, 1) for i in hit) if fault in REFUSED else None

        def settled() -> bool:
            now = jobs(conn)
            if any(s != "done" for s, _a, _r, _p in now.values()):
                return False
            rows = rejected(conn)
            if expected_refused is not None and len(rows) < len(expected_refused):
                return False
            return prevented(dirs) == len(rows)

        watch(settled, 40, "every job done and every refusal counted")

        # 1. nothing lost
        final = jobs(conn)
        assert sorted(final) == ids
        assert {i: s for i, (s, _a, _r, _p) in final.items()} == dict.fromkeys(ids, "done")
        # 2. one committed effect per job, its last attempt's, and that attempt's result stored with the job
        assert effects(conn) == {i: [final[i][1]] for i in ids}, (effects(conn), final)
        stored = dict(conn.execute("SELECT id, result FROM pgfence.job_history WHERE id = ANY(%s)", (ids,)))
        assert stored == {job_id: {"job_id": job_id, "attempt": attempt, "pid": pid}
                          for job_id, attempt, pid in conn.execute("SELECT * FROM matrix.effects")}, stored
        # 3. no lease left run out while B was idle
        assert watch.stale == [], watch.stale
        # 4. every attempt explained by the fault
        reclaims = 1 if fault in LEASE_FAULTS else 0
        want = {i: (2, reclaims) if i in hit else (1, 0) for i in ids}
        assert {i: (a_, r) for i, (_s, a_, r, _p) in final.items()} == want, (hit, final)
        if fault in ("hang", "block-loop"):
            errors = dict(conn.execute("SELECT id, last_error FROM pgfence.all_jobs WHERE id = ANY(%s)", (hit,)))
            assert all(e.startswith("timed out after 1s") for e in errors.values()), errors
        # 5. the refusals: counted as recorded, and only the stale attempts'
        rows = rejected(conn)
        assert prevented(dirs) == len(rows), (prevented(dirs), rows)
        if expected_refused is not None:
            assert rows == expected_refused, (rows, hit)
        else:
            assert set(rows) <= {(i, 1) for i in hit}, (rows, hit)
        for sup in (a, b):
            if sup.proc.poll() is None:
                sup.children()
                assert sup.stop(20) == 0, sup.log()
    finally:
        if proxy is not None:
            proxy.stop()

