"""The soak section: pgfence and pgqueuer under a steady offered rate, on the
embedded PostgreSQL 18 with its autovacuum on (the machine's own server has it
off, which no user runs for months).

For each system: its burst drain rate (N jobs enqueued first, drained as in
every other throughput section); a short search for the highest offered rate
whose queue stays bounded (each probe runs both systems at the same rate,
one after the other); that rate for the full duration, sampled every window
(jobs/s done, queue depth, the hot table's and the history's size, the hot
table's dead tuples and autovacuums).  Then what a large history costs the
claim of one job and the renewal of 1,000 leases, and the drop of one day's
history partition (when the schema has pgfence.job_history): soak_history.py.

A producer process (drivers.soak_producer) enqueues at the offered rate,
paced by the clock; jobs done in a window are the jobs enqueued (the id
sequence) less the jobs live, so the count reads only the hot table,
whatever the schema keeps of finished jobs.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import psycopg
from harness import (
    BENCH,
    PGQUEUER_PROBE,
    Pgfence,
    Run,
    Server,
    drain,
    execute,
    has_history,
    log,
    machine_busy,
    pgfence_probe,
    quiesce,
    stop_process,
    wait_for,
)
from soak_history import history_cost

#: The benchmark's interpreter (bench/.venv), which runs the drivers.
BENCH_PY = Path(sys.executable)

#: The criterion for a bounded queue (see bench/README.md, soak): at the end
#: of the run at most DEPTH_SECONDS of the offered rate is queued, and either
#: the queue depth's least-squares slope over the second half of the run is
#: at most SLOPE_SHARE of the rate (it grows by less than 2 jobs a second per
#: 100 offered) or the queue ends under SMALL_SECONDS of the rate (a queue
#: that small is not growing in any way that matters, and over a short run
#: the workers' start-up alone makes a slope).  A run whose producer offered
#: less than OFFERED_SHARE of the rate asked (the machine could not even
#: enqueue it) counts as unbounded.
DEPTH_SECONDS = 5.0
SLOPE_SHARE = 0.02
SMALL_SECONDS = 1.0
OFFERED_SHARE = 0.97

#: The first probe's rate as a share of the system's burst figure (the
#: issue's goal), and the step above the highest bounded rate while no rate
#: has failed yet.
FIRST_SHARE = 0.8
STEP_UP = 1.25

#: Jobs live, enqueued so far (the id sequence), the hot table's size and its
#: vacuum statistics; for pgfence also the history's size when the schema has
#: pgfence.job_history (every partition summed).
_STATS = ("SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(%(hot)s, 'id')), 0), "
          "pg_total_relation_size(%(hot)s::regclass), s.n_dead_tup, s.n_live_tup, s.autovacuum_count "
          "FROM pg_stat_user_tables s WHERE s.relid = %(hot)s::regclass")
_PGFENCE_HISTORY = ("SELECT sum(pg_total_relation_size(relid))::bigint "
                    "FROM pg_partition_tree(to_regclass('pgfence.job_history'))")


@dataclass(frozen=True)
class System:
    """One queue under soak: how to count its live jobs and size its tables."""

    key: str
    label: str
    config: str
    hot: str            # the table of live jobs, whose id sequence counts the enqueued
    live: str           # one count: jobs queued or running
    history: str        # one size in bytes (NULL: no history table of its own)


PGFENCE = System("pgfence", "pgfence", "--workers 2 --batch 100", "pgfence.jobs",
                 "SELECT count(*) FROM pgfence.jobs WHERE status IN ('queued', 'running')", _PGFENCE_HISTORY)
PGQUEUER = System("pgqueuer", "pgqueuer, asyncpg driver", "2 processes, batch 100", "pgqueuer",
                  "SELECT count(*) FROM pgqueuer", "SELECT pg_total_relation_size('pgqueuer_log')")


# -- the criterion and the search (pure) ---------------------------------------------------


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points; 0 for fewer than two."""
    if len(points) < 2:
        return 0.0
    mt = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else 0.0


def verdict(samples: list[dict], rate: float, offered: float) -> dict:
    """Whether a run at ``rate`` kept its queue bounded (DEPTH_SECONDS,
    SLOPE_SHARE, SMALL_SECONDS, OFFERED_SHARE), from its samples (``t``, ``live``) and the
    rate its producer managed."""
    end = samples[-1]
    half = [s for s in samples if s["t"] >= end["t"] / 2]
    if len(half) < 3:
        half = samples
    growth = slope([(s["t"], s["live"]) for s in half])
    checks = {"offered": offered >= OFFERED_SHARE * rate,
              "depth": end["live"] <= DEPTH_SECONDS * rate,
              "trend": growth <= SLOPE_SHARE * rate or end["live"] <= SMALL_SECONDS * rate}
    return {"bounded": all(checks.values()), "checks": checks, "depth_end": end["live"],
            "depth_limit": DEPTH_SECONDS * rate, "slope_per_s": round(growth, 1),
            "slope_limit": SLOPE_SHARE * rate, "offered_per_s": offered}


def next_rate(burst: float, lo: float, hi: float | None) -> float:
    """The next rate to probe for a system whose highest bounded rate so far
    is ``lo`` (0: none) and lowest unbounded ``hi`` (None: none): the
    goal's share of the burst figure first, up by STEP_UP while nothing
    failed, then halving the interval."""
    if hi is None:
        return FIRST_SHARE * burst if lo == 0 else lo * STEP_UP
    return (lo + hi) / 2 if lo else hi / 2


def round_rate(rate: float) -> int:
    """Two significant figures (a probe's rate is no finer than its noise)."""
    if rate < 100:
        return max(1, round(rate))
    digits = len(str(int(rate))) - 2
    return int(round(rate, -digits))


def windows(samples: list[dict]) -> list[dict]:
    """Per window between two samples: rates, depth and sizes at its end."""
    out = []
    for a, b in pairwise(samples):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        out.append({"t_end_s": round(b["t"], 1), "seconds": round(dt, 1),
                    "offered_per_s": round((b["enqueued"] - a["enqueued"]) / dt, 1),
                    "done_per_s": round((b["done"] - a["done"]) / dt, 1),
                    "depth": b["live"], "depth_max": b.get("live_max", b["live"]),
                    "hot_mib": round(b["hot_bytes"] / 2**20, 1),
                    "history_mib": None if b["history_bytes"] is None else round(b["history_bytes"] / 2**20, 1),
                    "dead_tuples": b["dead"], "autovacuums": b["autovacuums"] - a["autovacuums"],
                    "machine_busy": busy_share(a, b)})
    return out


def busy_share(a: dict, b: dict) -> float | None:
    """The share of the machine's CPU busy (with anything) between two
    samples, from their ``busy`` readings of /proc/stat."""
    if "busy" not in a or "busy" not in b:
        return None
    total = b["busy"][1] - a["busy"][1]
    return round((b["busy"][0] - a["busy"][0]) / total, 3) if total > 0 else None


# -- the embedded server ------------------------------------------------------------------------


class Embedded:
    """pgfence's embedded PostgreSQL 18 (its ``embedded`` extra, in the
    project's interpreter) on a data directory of the run's own, removed at
    the end: never the user's own embedded server."""

    def __init__(self, pgfence: Pgfence):
        self.pgfence = pgfence
        self.pgdata = Path(tempfile.mkdtemp(prefix="pgfence-bench-soak-")) / "pgdata"

    def _call(self, verb: str) -> str:
        script = ("import sys, warnings; warnings.simplefilter('ignore'); from pathlib import Path\n"
                  "from pgfence.store import embedded\n"
                  f"print(embedded.{verb}(Path(sys.argv[1])))")
        done = subprocess.run([str(self.pgfence.python), "-c", script, str(self.pgdata)], capture_output=True,
                              text=True, env=self.pgfence.env, check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise RuntimeError(f"embedded PostgreSQL {verb}: {lines[-1] if lines else done.returncode} "
                               "(the soak section needs pgfence's [embedded] extra in the project's .venv)")
        return done.stdout.strip()

    def start(self) -> str:
        return self._call("start")

    def stop(self, keep: bool) -> None:
        self._call("stop")
        if not keep:
            shutil.rmtree(self.pgdata.parent, ignore_errors=True)


# -- the section ---------------------------------------------------------------------------------


class Soak:
    """The soak section of one benchmark run (``bench`` is run.Bench)."""

    def __init__(self, bench):
        self.bench = bench
        self.args = bench.args
        self.pgfence: Pgfence = bench.pgfence
        self.server: Server | None = None
        self.dsn: dict[str, str] = {}
        self.out: dict = {}

    def run(self) -> dict:
        embedded = Embedded(self.pgfence)
        try:
            self.server = Server(embedded.start())
            self.out = {"server": self.server.facts(), "criterion": {
                "depth_seconds": DEPTH_SECONDS, "slope_share": SLOPE_SHARE, "small_seconds": SMALL_SECONDS,
                "offered_share": OFFERED_SHARE},
                "settings": {k: getattr(self.args, k) for k in (
                    "soak_minutes", "soak_probe_s", "soak_probes", "soak_window_s", "soak_burst_n",
                    "soak_history_rows")}}
            self.dsn = {"pgfence": self.server.create("soak_pgfence"), "pgqueuer": self.server.create("soak_pgqueuer")}
            self.pgfence.migrate(self.dsn["pgfence"])
            self.out["history_table"] = has_history(self.dsn["pgfence"])
            self.capacity()
            self.out.update(history_cost(self.server, self.pgfence, self.args, self.out["history_table"]))
        finally:
            if self.server is not None:
                self.server.drop_all()
            embedded.stop(self.args.keep)
        return self.out

    # -- burst, search, full run --------------------------------------------------------------

    def capacity(self) -> None:
        a = self.args
        systems = (PGFENCE, PGQUEUER)
        for s in systems:
            rates = [self.burst(s) for _ in range(a.runs)]
            self.out[s.key] = {"label": s.label, "config": s.config, "burst_n": a.soak_burst_n,
                               "burst_runs": rates, "burst_per_s": statistics.median(rates), "probes": []}
            log(f"soak: {s.label} burst, {s.config}: {statistics.median(rates):,.0f} jobs/s")
        bounds = {s.key: [0.0, None] for s in systems}
        for i in range(a.soak_probes):
            # Alternate whose next rate is probed; both systems run at it.
            s = systems[i % 2]
            lo, hi = bounds[s.key]
            rate = round_rate(next_rate(self.out[s.key]["burst_per_s"], lo, hi))
            for other in (systems if i % 2 == 0 else systems[::-1]):
                result = self.steady(other, rate, a.soak_probe_s, a.soak_probe_window_s)
                self.out[other.key]["probes"].append(result)
                b = bounds[other.key]
                if result["verdict"]["bounded"]:
                    b[0] = max(b[0], rate)
                else:
                    b[1] = rate if b[1] is None else min(b[1], rate)
        for s in systems:
            lo, _ = bounds[s.key]
            probes = self.out[s.key]["probes"]
            rate = lo or round_rate(min(p["rate"] for p in probes) / 2)
            self.out[s.key]["chosen_rate"] = rate
            self.out[s.key]["full"] = full = self.steady(s, rate, a.soak_minutes * 60, a.soak_window_s)
            self.out[s.key]["sustained_per_s"] = rate if full["verdict"]["bounded"] else None
            burst = self.out[s.key]["burst_per_s"]
            self.out[s.key]["sustained_of_burst"] = rate / burst if full["verdict"]["bounded"] and burst else None

    def reset(self, s: System) -> None:
        dsn = self.dsn[s.key]
        if s is PGFENCE:
            history = ", pgfence.job_history" if self.out.get("history_table") else ""
            execute(dsn, f"TRUNCATE pgfence.jobs{history} RESTART IDENTITY")
        else:
            self.bench_driver("pgqueuer_worker", "setup", dsn, "0", name="soak-pgqueuer")
        execute(dsn, f"VACUUM ANALYZE {s.hot}", "CHECKPOINT")

    def bench_driver(self, module: str, *argv: str, name: str) -> None:
        subprocess.run([str(BENCH_PY), "-m", f"drivers.{module}", *argv], cwd=BENCH, check=True,
                       stdout=self.bench.logfile(name), stderr=subprocess.STDOUT)

    def workers(self, s: System) -> list[subprocess.Popen]:
        dsn = self.dsn[s.key]
        if s is PGFENCE:
            return [self.pgfence.run(dsn, 2, 100, self.bench.logfile("soak-pgfence"))]
        return [self.bench.start_driver("pgqueuer_worker", "serve", dsn, "apg", "100", name="soak-pgqueuer")
                for _ in range(2)]

    def burst(self, s: System) -> float:
        """One drain of N jobs enqueued first, the same configuration."""
        a, dsn, n = self.args, self.dsn[s.key], self.args.soak_burst_n
        self.reset(s)
        if s is PGFENCE:
            execute(dsn, f"INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, {int(n)})")
            probe = pgfence_probe(dsn)
        else:
            self.bench_driver("pgqueuer_worker", "setup", dsn, str(n), name="soak-pgqueuer")
            probe = PGQUEUER_PROBE
        execute(dsn, f"VACUUM ANALYZE {s.hot}", "CHECKPOINT")
        if s is PGFENCE:
            run: Run = drain(dsn, n, a.cap, lambda: self.workers(s), probe, stop_all)
        else:
            # pgqueuer's drain mode ends each process once the queue is empty.
            run = drain(dsn, n, a.cap,
                        lambda: [self.bench.start_driver("pgqueuer_worker", "work", dsn, "apg", "100",
                                                         name="soak-pgqueuer") for _ in range(2)],
                        probe, self.bench.wait_exit)
        return round(run.rate, 1)

    def steady(self, s: System, rate: int, seconds: float, window: float) -> dict:
        """``rate`` jobs/s offered for ``seconds``, sampled every ``window``."""
        dsn = self.dsn[s.key]
        log(f"soak: {s.label}, {s.config}, {rate:,} jobs/s offered for {seconds:g} s")
        self.reset(s)
        # As every drain does: wait (up to --quiet-timeout) for a quiet machine.
        quiet = quiesce()
        procs = self.workers(s)
        producer = None
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                others = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
                if not wait_for(lambda: conn.execute(others).fetchone()[0] >= 2, 60):
                    raise RuntimeError(f"the {s.label} workers did not come up")
                time.sleep(1.0)     # the workers' own start-up queries
                # The harness keeps the time: the producer is told an hour
                # more and stopped (SIGTERM) at the last sample, so that every
                # window is whole and the producer offers jobs in all of them.
                producer = subprocess.Popen(
                    [str(BENCH_PY), "-m", "drivers.soak_producer", s.key, dsn, str(rate), str(seconds + 3600)],
                    cwd=BENCH, stdout=subprocess.PIPE, stderr=self.bench.logfile(f"soak-producer-{s.key}"),
                    text=True, start_new_session=True)
                samples = self.sample_until(conn, s, producer, procs, window, seconds)
            stop_process(producer, signal.SIGTERM, 10)
            summary = json.loads(producer.stdout.read() or "{}")
        finally:
            if producer is not None:
                stop_process(producer, signal.SIGTERM, 10)
            stop_all(procs)
        result = {"rate": rate, "seconds": seconds, "window_s": window, "busy_before": round(quiet, 3),
                  "producer": summary,
                  "windows": windows(samples),
                  "verdict": verdict(samples, rate, summary.get("offered_per_s", 0.0))}
        v = result["verdict"]
        log(f"  {'bounded' if v['bounded'] else 'NOT bounded'}: depth at the end {v['depth_end']:,} "
            f"(limit {v['depth_limit']:,.0f}), slope {v['slope_per_s']:,.1f}/s (limit {v['slope_limit']:,.1f}), "
            f"offered {v['offered_per_s']:,.0f}/s")
        return result

    def sample_until(self, conn: psycopg.Connection, s: System, producer: subprocess.Popen,
                     procs: list[subprocess.Popen], window: float, seconds: float) -> list[dict]:
        """Samples at the start, every ``window`` s and at ``seconds``; the
        queue depth is also read every second for its maximum."""
        t0 = time.monotonic()
        base = conn.execute(_STATS, {"hot": s.hot}).fetchone()[0]

        def sample(live_max: int) -> dict:
            enq, hot_bytes, dead, live_tup, autovacuums = conn.execute(_STATS, {"hot": s.hot}).fetchone()
            live = conn.execute(s.live).fetchone()[0]
            history = conn.execute(s.history).fetchone()[0]
            enqueued = enq - base
            return {"t": time.monotonic() - t0, "enqueued": enqueued, "live": live, "done": enqueued - live,
                    "live_max": max(live_max, live), "hot_bytes": hot_bytes, "history_bytes": history,
                    "dead": dead, "live_tuples": live_tup, "autovacuums": autovacuums, "busy": machine_busy()}

        samples = [sample(0)]
        live_max, next_at = 0, min(window, seconds)
        while True:
            time.sleep(max(0.0, min(1.0, t0 + next_at - time.monotonic())))
            failed = [p for p in (*procs, producer) if p.poll() is not None]
            if failed:
                raise RuntimeError(f"{'the producer' if failed[0] is producer else 'a worker'} exited with "
                                   f"status {failed[0].returncode} during the soak")
            live_max = max(live_max, conn.execute(s.live).fetchone()[0])
            if time.monotonic() - t0 >= next_at:
                samples.append(sample(live_max))
                if next_at >= seconds:
                    return samples
                live_max, next_at = 0, min(next_at + window, seconds)


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        stop_process(p, signal.SIGTERM)
