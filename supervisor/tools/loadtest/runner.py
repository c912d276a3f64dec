"""``pgfence loadtest``: the run from start to report.

Bounded in time: the supervisors get 30 s plus a quarter second per worker
to be ready, the jobs ``--timeout`` to end, the workers two leases plus 10 s
to settle, each supervisor its drain plus 10 s to stop.  Everything started
here (supervisors, PgBouncer, proxy, email API, embedded server, temp dir)
is stopped on the way out, also on an error, Ctrl-C or SIGTERM.

The run ends when every job has ended and every enabled fault has been
injected at least once (or at the deadline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from pgfence.admin import limits as admin_limits
from pgfence.errors import PgfenceError
from pgfence.tools.mailsink import MailSink
from pgfence.tools.loadtest import audit
from pgfence.tools.loadtest import mix
from pgfence.tools.loadtest import options
from pgfence.tools.loadtest import report
from pgfence.tools.loadtest import statements as loadtest_store
from pgfence.store.pools import ASYNC_MAX as ASYNC_POOL_MAX
from pgfence.tools.loadtest import store
from pgfence.tools.loadtest.faults import Faults
from pgfence.tools.loadtest.fleet import Fleet, Scrape
from pgfence.tools.loadtest.options import Plan
from pgfence.tools.loadtest.pgbouncer import PgBouncer
from pgfence.tools.loadtest.proxy import Proxy
from pgfence.tools.loadtest.server import Server

POLL = 0.5


def _limits_text(limits: tuple[int | None, int | None]) -> str:
    concurrency, per_key = limits
    return (f"concurrency {'none' if concurrency is None else concurrency}, "
            f"per key {'none' if per_key is None else per_key}")


def main(args: argparse.Namespace) -> int:
    plan = options.plan(args)

    def interrupted(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGTERM, interrupted), (signal.SIGINT, signal.default_int_handler))}
    try:
        with contextlib.ExitStack() as stack:
            try:
                return LoadTest(plan, stack).run()
            finally:
                # A second Ctrl-C must not cut the cleanup short.
                for sig in previous:
                    signal.signal(sig, signal.SIG_IGN)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def metric_totals(scrapes: list[Scrape]) -> dict[str, Any]:
    """Counters summed over the supervisors' scrapes."""
    def total(name: str) -> int:
        return round(sum(v for s in scrapes for (n, _labels), v in s.items() if n == name))

    lost: dict[str, int] = {}
    for s in scrapes:
        for (n, labels), v in s.items():
            if n == "pgfence_lease_lost_total":
                reason = dict(labels).get("reason", "")
                lost[reason] = lost.get(reason, 0) + round(v)
    out: dict[str, Any] = {name: total(f"pgfence_{name}") for name in (
        "reclaims_total", "double_run_prevented_total", "worker_restarts_total", "jobs_claimed_total",
        "jobs_completed_total", "jobs_retried_total", "jobs_failed_total", "jobs_released_total")}
    out["lease_lost_total"] = dict(sorted(lost.items()))
    return out


class LoadTest:
    def __init__(self, plan: Plan, stack: contextlib.ExitStack):
        self.plan = plan
        self.stack = stack
        self.queue = f"loadtest-{secrets.token_hex(4)}"
        self.conn: psycopg.Connection | None = None

    # -- setting up ---------------------------------------------------------------

    def _setup(self) -> None:
        plan, stack = self.plan, self.stack
        self.tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pgfence-loadtest-")))
        self.log_dir = Path(plan.log_dir) if plan.log_dir else self.tmp / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.server = Server.open(plan.dsn, embedded_in=self.tmp if plan.embedded else None)
        stack.callback(self.server.close)
        stack.callback(self._close_conn)
        # Per supervisor, besides its workers: the heartbeat manager's, its
        # self-vacuum's and the metrics server's connections, and one spare.
        needed = plan.supervisors * (plan.workers * self.connections_per_worker() + 4)
        if not plan.pgbouncer and needed > self.server.max_connections - 5:
            print(f"pgfence loadtest: warning: {plan.supervisors} x {plan.workers} workers need up to {needed} "
                  f"connections and the server allows {self.server.max_connections}: use --pgbouncer",
                  file=sys.stderr)
        self.sink = MailSink().start()
        stack.callback(self.sink.stop)
        self.proxy = Proxy(self.server.upstream)
        stack.callback(self.proxy.stop)
        ports = self.proxy.start(1 if plan.pgbouncer else plan.supervisors)
        if plan.pgbouncer:
            bouncer = PgBouncer(self.tmp, server_port=ports[0], dbname=self.server.dbname, user=self.server.user,
                                password=self.server.password)
            stack.callback(bouncer.stop)
            dsns = [self.server.client_dsn("127.0.0.1", bouncer.start())] * plan.supervisors
            self.link_names = ["pgbouncer"]
        else:
            dsns = [self.server.client_dsn("127.0.0.1", port) for port in ports]
            self.link_names = [f"supervisor {i}" for i in range(plan.supervisors)]
        self.graceful = plan.sleep_max + 5
        self.fleet = Fleet(count=plan.supervisors, workers=plan.workers, batch=plan.batch, threads=plan.threads,
                           async_concurrency=plan.async_concurrency, handlers=mix.handler_modules(plan.weights),
                           queue=self.queue,
                           lease=plan.lease, poll_interval=plan.poll_interval, graceful=self.graceful, dsns=dsns,
                           mail_url=self.sink.url, listen=not plan.pgbouncer, unprotected=plan.unprotected,
                           workdir=self.tmp, log_dir=self.log_dir,
                           env={mix.LIMITS_ENV: mix.encode(plan.limits)} if plan.limits else None)
        # On the way out: stop the supervisors, then cancel what is left of
        # the run's jobs (nothing after a complete run).
        stack.callback(self._cancel_leftovers)
        stack.callback(self.fleet.shutdown)
        self.fleet.start()
        self.fleet.wait_ready(30 + 0.25 * plan.supervisors * plan.workers)
        self._wait_limits(10.0)

    def _wait_limits(self, timeout: float) -> None:
        """Until pgfence.limits holds the limited kinds' limits as the mix
        gives them (each supervisor records its handlers' at start), so that
        every job of those kinds is gated from its enqueue; PgfenceError if
        another limit stays in force (one set at run time wins until reset)."""
        if not self.plan.limits:
            return
        wanted = {lim.kind(name): (lim.concurrency, lim.per_key) for name, lim in self.plan.limits.items()}
        deadline = time.monotonic() + timeout
        while True:
            rows = [row for row in admin_limits.list_limits(self._db()) if row["kind"] in wanted]
            found = {row["kind"]: (row["concurrency"], row["per_key_concurrency"]) for row in rows}
            declared = {row["kind"]: (row["declared"]["concurrency"], row["declared"]["per_key_concurrency"])
                        for row in rows}
            wrong = {kind: found.get(kind) for kind, want in wanted.items() if found.get(kind) != want}
            if not wrong:
                return
            # Declared as the mix says, and overridden: no use waiting.
            overridden = any(declared.get(kind) == wanted[kind] for kind in wrong)
            if overridden or time.monotonic() > deadline:
                kind = next((k for k in sorted(wrong) if declared.get(k) == wanted[k]), min(wrong))
                got, want = wrong[kind], wanted[kind]
                if got is None:
                    raise PgfenceError(f"kind {kind!r} has no limits in pgfence.limits {timeout:g}s after its "
                                       f"supervisors were ready (the mix's: {_limits_text(want)})")
                raise PgfenceError(
                    f"kind {kind!r} runs under limits {_limits_text(got)}, not the mix's {_limits_text(want)}: "
                    f"reset them with 'pgfence limits reset {kind}'")
            time.sleep(0.1)

    def connections_per_worker(self) -> int:
        """The most connections one worker child opens: its own, and when it
        runs many jobs at once its threads' pool (threads + 3) and its event
        loop's pool (at most 10), plus the loop's own two for claims and
        completions when its handlers are all async (counted whenever it
        has a loop: at worst)."""
        plan = self.plan
        if plan.capacity == 1:
            return 1
        return 1 + plan.threads + 3 + (min(plan.async_concurrency, ASYNC_POOL_MAX) + 2 if plan.with_async else 0)

    def held_per_worker(self) -> int:
        """The most leases one worker child holds at once: a claim's batch;
        for one that runs many jobs at once, its jobs in flight plus as many
        ended but not yet completed (its slot table has room for twice its
        capacity)."""
        plan = self.plan
        return max(plan.claim_size, 1 if plan.capacity == 1 else 2 * plan.capacity)

    def _cancel_leftovers(self) -> None:
        try:
            left = loadtest_store.cancel_leftovers(self._db(), self.queue)
            if left:
                print(f"pgfence loadtest: cancelled {left} job(s) left in queue {self.queue}", file=sys.stderr)
        except (psycopg.Error, PgfenceError) as exc:
            print(f"pgfence loadtest: could not cancel the jobs left in queue {self.queue}: {exc}", file=sys.stderr)

    def _close_conn(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _db(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = self.server.connect()
        return self.conn

    # -- the run ----------------------------------------------------------------------

    def run(self) -> int:
        started = time.monotonic()
        self._setup()
        plan = self.plan
        specs = mix.make_jobs(plan.counts, random.Random(plan.seed), sleep_mean=plan.sleep_mean,
                              sleep_max=plan.sleep_max, limits=plan.limits)
        # Before the first job can run: a deadlock of this run shows as a
        # change of the database's cumulative count.
        self.deadlocks_before = loadtest_store.deadlocks(self._db())
        enqueued = store.enqueue(self._db(), self.queue, specs)
        self.enqueued = {job_id: spec.mix for job_id, spec in enqueued.items()}
        self.keys = {job_id: spec.concurrency_key for job_id, spec in enqueued.items()
                     if spec.concurrency_key is not None}
        zero = time.monotonic()
        self.db_zero = loadtest_store.clock(self._db())
        self.faults = Faults(plan.faults, seed=plan.seed, interval=plan.fault_interval, lease=plan.lease,
                             fleet=self.fleet, proxy=self.proxy, server=self.server, link_names=self.link_names,
                             clock_zero=zero, xmin_hold=plan.xmin_hold)
        self.stack.callback(self.faults.finish)
        self.samples: list[tuple[float, float]] = []
        self.timed_out = self._wait(zero)
        self.faults.finish()
        self._settle()
        scrapes = self._stop_fleet()
        evidence = self._evidence(scrapes)
        result = audit.run(evidence)
        rep = self._report(evidence, result, time.monotonic() - started)
        print(json.dumps(rep, indent=2, default=str) if plan.json else report.text(rep))
        if plan.plot:
            finished = report.ended_since(evidence.jobs, evidence.db_zero)
            report.plot(plan.plot, rep, finished, self.samples)
        return 0 if result["passed"] else 1

    def _wait(self, zero: float) -> bool:
        """Inject faults and follow the queue until every job has ended and
        every fault was injected once; True if the deadline came first."""
        progress = report.Progress(len(self.enqueued), self.plan.progress)
        self.stack.callback(progress.close)
        deadline = zero + self.plan.timeout
        next_poll = 0.0
        try:
            while True:
                now = time.monotonic()
                self.faults.tick(now)
                if now >= next_poll:
                    next_poll = now + POLL
                    counts = self._states()
                    self.fleet.note_exits()
                    if counts is not None:
                        live = counts.get("queued", 0) + counts.get("running", 0)
                        progress.update(len(self.enqueued) - live, counts.get("running", 0), now - zero,
                                        sum(self.faults.counts.values()))
                        if self.plan.plot:
                            self._sample(now - zero)
                        if live == 0 and self.faults.covered:
                            return False
                    if not any(s.alive() for s in self.fleet.supervisors):
                        return False
                    if now >= deadline:
                        return True
                time.sleep(0.05)
        finally:
            progress.close()

    def _states(self) -> dict[str, int] | None:
        try:
            return loadtest_store.states(self._db(), self.queue)
        except (psycopg.Error, PgfenceError):
            self._close_conn()   # a restart or a broken connection: next time
            return None

    def _sample(self, t: float) -> None:
        scrapes = [s.scrape() for s in self.fleet.supervisors if s.alive()]
        self.samples.append((t, metric_totals([s for s in scrapes if s])["reclaims_total"]))

    def _settle(self) -> None:
        """Let workers that were stopped or cut off finish with the jobs they
        lost (their fence rejections count), until all are idle."""
        deadline = time.monotonic() + 2 * self.plan.lease + 10
        while time.monotonic() < deadline and not self.fleet.all_idle():
            time.sleep(0.1)

    def _stop_fleet(self) -> list[Scrape | None]:
        """Scrape each supervisor's /metrics just before stopping it."""
        scrapes: list[Scrape | None] = []
        for s in self.fleet.supervisors:
            scrapes.append(s.scrape() if s.alive() else None)
            self.fleet.stop(s, self.graceful + 10)
        return scrapes

    # -- the evidence and the report ------------------------------------------------

    def _evidence(self, scrapes: list[Scrape | None]) -> audit.Evidence:
        conn = self._db()
        ok = all(s is not None for s in scrapes)
        plan = self.plan
        # A restart breaks every connection of every worker: its own and its pools'.
        broken = (sum(self.faults.terminated.values())
                  + self.server.restarts * plan.supervisors * plan.workers * self.connections_per_worker())
        # Read after every supervisor stopped: a backend reports its
        # deadlocks to the statistics at the latest when it exits.
        deadlocks = loadtest_store.deadlocks(conn) - self.deadlocks_before
        limited = [job_id for job_id, name in self.enqueued.items() if name in plan.limits]
        return audit.Evidence(
            jobs=store.jobs(conn, self.queue), enqueued=self.enqueued,
            effects=store.rows_by_job(conn, self.queue, "effects"),
            receipts=store.rows_by_job(conn, self.queue, "receipts"),
            deliveries=dict(self.sink.deliveries), unprotected=self.plan.unprotected,
            metrics=metric_totals([s for s in scrapes if s]) if ok else None,
            supervisors=[{"index": s.index, "exit_status": s.exit_status, "exited_early": s.exited_early,
                          "scraped": scrape is not None, "log_tail": s.tail() if s.exit_status else ""}
                         for s, scrape in zip(self.fleet.supervisors, scrapes, strict=True)],
            batch=plan.claim_size, held=self.held_per_worker(), broken=broken, faults=dict(self.faults.counts),
            fault_events=list(self.faults.events),
            lease=plan.lease, db_zero=self.db_zero, deadlocks=deadlocks,
            limits=dict(plan.limits), keys=self.keys, attempts=store.attempts(conn, limited))

    def _report(self, ev: audit.Evidence, result: dict[str, Any], elapsed: float) -> dict[str, Any]:
        f = self.faults
        return {
            "config": self.plan.describe(),
            "queue": self.queue,
            "elapsed_seconds": round(elapsed, 3),
            "timed_out": self.timed_out,
            "summary": report.summary(ev.jobs, self.enqueued),
            "metrics": ev.metrics,
            "database": audit.database_totals(ev),
            "faults": {"injected": dict(f.counts), "skipped": dict(f.skipped), "events": f.events,
                       "xmin_holds": report.around_holds(ev.jobs, f.events, ev.db_zero),
                       "terminated": dict(f.terminated), "server_restarts": self.server.restarts},
            "email": {"requests": sum(ev.deliveries.values()), "distinct_keys": len(ev.deliveries)},
            # The most attempts of each limited mix that held a live lease
            # at once (and of one key), from the audit.
            "limits": next((c["maxima"] for c in result["checks"] if c["name"] == "concurrency limits"), []),
            "audit": result,
            "logs": str(self.log_dir) if self.plan.log_dir else None,
        }
