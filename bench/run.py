"""The pgfence benchmark: throughput, pickup latency, lease renewal, claim
cost and memory, side by side with pgqueuer, procrastinate, a naive psycopg
loop and pgbench running pgfence's own statements, on the same PostgreSQL.

Run it through bench/run.sh, which makes the benchmark's virtual environment
(bench/.venv) first.  It creates its own databases (pgfence_bench_*) on the
server of --admin-dsn and drops them at the end, prints a markdown report to
stdout (progress goes to stderr) and writes bench/results/latest.json.

Every throughput figure is measured the same way: N no-op jobs are enqueued
first (one statement), the table is vacuumed and analyzed and a checkpoint
taken; then the workers start and the harness polls the table until no job
is left.  jobs/s is N over the time from the first job taken to the last one
finished, on the database clock (every system records both), the median of
--runs runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import harness
import psycopg
from harness import (
    BENCH,
    DISTURBED,
    PGQUEUER_PROBE,
    PREFIX,
    WORKLOAD_PIDS,
    PoolMemory,
    RESULTS,
    Pgfence,
    Probe,
    Run,
    Series,
    Server,
    all_jobs,
    claim_params,
    cmdline,
    descendants,
    drain,
    drain_counted,
    execute,
    fill_pgfence,
    fold,
    free_port,
    has_history,
    log,
    memory,
    percentile,
    pgfence_probe,
    stop_process,
    time_claims,
    wait_for,
)
from enqueue_bench import EnqueueSection
from report import REFERENCE, goals, machine_facts, markdown
from soak import Soak
from soak_history import insert_history
from options import SECTIONS, parse_args

BENCH_PY = Path(sys.executable)
#: The io section's variants: what each job does during its wait.
IO_VARIANTS = {"sleep": "sleep", "http": "HTTP call", "row": "fenced row"}

#: How procrastinate's drains are watched (pgfence's and pgqueuer's probes are
#: in harness.py): jobs left, the first job taken, and (jobs done, first taken
#: to last done) on the database clock, from its own tables.
PROCRASTINATE_PROBE = Probe(
    left="SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
    started="SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status <> 'todo')",
    window="SELECT count(*) FILTER (WHERE type = 'succeeded'), "
           "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') "
           "- min(at) FILTER (WHERE type = 'started'))::float8 FROM procrastinate_events")


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.pgfence = Pgfence(Path(args.pgfence_root), Path(args.project_python))
        self.server = Server(args.admin_dsn)
        self.series: dict[str, Series] = {}
        self.metrics: dict[str, dict] = {}
        self.errors: dict[str, str] = {}
        self.logdir = Path(tempfile.mkdtemp(prefix="pgfence-bench-"))
        self.main_dsn = ""
        self.probe: Probe | None = None

    # -- plumbing -------------------------------------------------------------

    def logfile(self, name: str):
        return open(self.logdir / f"{name}.log", "ab")

    def tail(self, name: str, lines: int = 5) -> str:
        try:
            text = (self.logdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def measure(self, key: str, system: str, config: str, n: int, once: Callable[[], Run],
                runs: int | None = None) -> Series:
        """--runs (or ``runs``) drains of one system in one configuration."""
        s = Series(key, system, config, n, reference=REFERENCE.get(key, ""))
        self.series[key] = s
        runs = runs or self.args.runs
        # For runs that another workload disturbed; none when the runs do not
        # wait for a quiet machine (a run again would be disturbed as well).
        retries = runs if self.args.quiet_timeout > 0 else 0
        while len(s.runs) < runs:
            try:
                run = once()
            except Exception as exc:  # noqa: BLE001 - one failed series must not stop the bench
                s.error = f"{type(exc).__name__}: {exc}"
                log(f"  {system}, {config}: FAILED: {s.error}")
                break
            cpu = run.cpu
            other = cpu.get("other_share", 0.0)
            mem = run.extra.get("memory") or {}
            mem_text = (f"; pool USS {mem['uss_max_mib']:.0f} MiB, RSS {mem['rss_max_mib']:.0f} MiB (max)"
                        if mem else "")
            log(f"  {system}, {config}, run {len(s.runs) + 1}/{runs}: {run.done:,} jobs, "
                f"{run.rate:,.0f} jobs/s ({run.wall_rate:,.0f} with startup){' CAPPED' if run.capped else ''}; "
                f"CPU ms/1k jobs {cpu.get('client_ms_per_1k', '-')} client, {cpu.get('server_ms_per_1k', '-')} "
                f"server; machine busy {cpu.get('machine_busy', 0):.0%}, {other:.0%} of it elsewhere{mem_text}")
            if other > DISTURBED and retries > 0:
                retries -= 1
                s.discarded.append(run)
                log(f"  disturbed ({other:.0%} of the machine's CPU went elsewhere): run again")
                continue
            s.runs.append(run)
        return s

    def start_driver(self, module: str, *argv: str, name: str) -> subprocess.Popen:
        return subprocess.Popen([str(BENCH_PY), "-m", f"drivers.{module}", *argv], cwd=BENCH,
                                stdout=self.logfile(name), stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def wait_exit(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
        for p in procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_process(p, signal.SIGTERM, 5)

    # -- pgfence ------------------------------------------------------------------

    def pgfence_once(self, n: int, workers: int, batch: int, kind: str = "noop", payload: str = "{}") -> Run:
        fill_pgfence(self.main_dsn, n, kind, payload)
        name = f"pgfence-{kind}-w{workers}-b{batch}"

        def stop(procs: list[subprocess.Popen]) -> None:
            for p in procs:
                stop_process(p, signal.SIGTERM)

        try:
            return drain(self.main_dsn, n, self.args.cap,
                         lambda: [self.pgfence.run(self.main_dsn, workers, batch, self.logfile(name))],
                         self.probe, stop)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; log: {self.tail(name)}") from None

    def bench_pgfence(self) -> None:
        a = self.args
        for workers, batch in a.pgfence_configs:
            # One job per claim is the slow path: the smaller N keeps it in time.
            # Batch 0: no --batch, pgfence's default (the free slots: 1 with one thread).
            n = a.n_small if batch <= 1 else a.n
            config = f"--workers {workers} --batch {batch}" if batch else f"--workers {workers} (default settings)"
            log(f"pgfence run, no-op jobs, {config}, N={n:,}")
            self.measure(f"pgfence_noop_w{workers}_b{batch}" if batch else f"pgfence_noop_w{workers}_default",
                         "pgfence, no-op", config, n, lambda w=workers, b=batch, n=n: self.pgfence_once(n, w, b))

    def bench_effect(self) -> None:
        a = self.args
        for workers in (4, 16):
            for batch in a.effect_batches:
                log(f"pgfence run, effect jobs (a row + the completion in one transaction each), "
                    f"--workers {workers} --batch {batch}, N={a.n_small:,}")
                self.measure(f"pgfence_effect_w{workers}_b{batch}", "pgfence, effect row",
                             f"--workers {workers} --batch {batch}", a.n_small,
                             lambda w=workers, b=batch: self.pgfence_once(a.n_small, w, b, "effect",
                                                                          '{"seconds": 0}'))

    # -- pgqueuer, procrastinate, the naive loop ------------------------------------

    def bench_pgqueuer(self) -> None:
        a = self.args
        dsn = self.server.create("pgqueuer")
        probe = PGQUEUER_PROBE
        processes, batch = 2, 100
        for driver, label, n in (("apg", "asyncpg", a.n), ("psy", "psycopg", a.n_small)):
            name = f"pgqueuer-{driver}"
            log(f"pgqueuer, {label} driver, {processes} processes, batch {batch}, N={n:,}")

            def once(driver=driver, n=n, name=name) -> Run:
                subprocess.run([str(BENCH_PY), "-m", "drivers.pgqueuer_worker", "setup", dsn, str(n)], cwd=BENCH,
                               check=True, stdout=self.logfile(name), stderr=subprocess.STDOUT)
                execute(dsn, "VACUUM ANALYZE pgqueuer", "VACUUM ANALYZE pgqueuer_log", "CHECKPOINT")
                return drain(dsn, n, a.cap,
                             lambda: [self.start_driver("pgqueuer_worker", "work", dsn, driver, str(batch), name=name)
                                      for _ in range(processes)],
                             probe, self.wait_exit)

            self.measure(f"pgqueuer_{driver}", f"pgqueuer, {label} driver",
                         f"{processes} processes, batch {batch}", n, once)

    def bench_procrastinate(self) -> None:
        a = self.args
        dsn = self.server.create("procrastinate")
        n, processes, concurrency = a.n_small, 2, a.procrastinate_concurrency
        probe = PROCRASTINATE_PROBE
        log(f"procrastinate, {processes} processes, concurrency {concurrency}, N={n:,}")

        def once() -> Run:
            subprocess.run([str(BENCH_PY), "-m", "drivers.procrastinate_worker", "setup", dsn, str(n)], cwd=BENCH,
                           check=True, stdout=self.logfile("procrastinate"), stderr=subprocess.STDOUT)
            execute(dsn, "VACUUM ANALYZE procrastinate_jobs", "CHECKPOINT")
            return drain(dsn, n, a.cap,
                         lambda: [self.start_driver("procrastinate_worker", "work", dsn, str(concurrency),
                                                    name="procrastinate") for _ in range(processes)],
                         probe, self.wait_exit)

        self.measure("procrastinate", "procrastinate", f"{processes} processes, concurrency {concurrency}", n, once)

    def bench_naive(self) -> None:
        a = self.args
        processes = 4
        for batch, n, key in ((1, a.n_small, "naive_one"), (50, a.n, "naive_batch50")):
            log(f"naive psycopg loop, {processes} processes, batch {batch}, N={n:,}")

            def once(batch=batch, n=n) -> Run:
                fill_pgfence(self.main_dsn, n)
                return drain(self.main_dsn, n, a.cap,
                             lambda: [self.start_driver("naive_worker", self.main_dsn, str(batch),
                                                        name=f"naive-{batch}") for _ in range(processes)],
                             self.probe, self.wait_exit)

            label = "one job per claim" if batch == 1 else f"{batch} jobs per claim"
            self.measure(key, "naive psycopg loop, no fence", f"{processes} processes, {label}", n, once)

    # -- pgbench -------------------------------------------------------------------------

    def render_pgbench(self, template: str, batch: int) -> Path:
        """A pgbench script from bench/pgbench/TEMPLATE with pgfence's current SQL."""
        queries = self.pgfence.queries()
        # reclaim false: the claim as a worker sends it but about once a second.
        literals = {"queues": "'{default}'", "batch": str(batch), "worker": "'pgbench'", "lease": "30",
                    "lease_kinds": "'{}'", "lease_secs": "'{}'", "reclaim": "false", "kinds": "NULL",
                    "not_kinds": "NULL"}
        if batch == 1:
            select = ("SELECT coalesce(min(id), 0) AS id, coalesce(min(attempt), 0) AS attempt, count(*) AS n "
                      "FROM bench_claimed")
        else:
            # Array literals as text: under -M prepared each :variable is
            # bound as a parameter, so no quoting.
            select = ("SELECT coalesce(array_agg(id), '{}')::text AS ids, "
                      "coalesce(array_agg(attempt), '{}')::text AS attempts, count(*) AS n "
                      "FROM bench_claimed")
        values = {
            "claim": wrap_returning(substitute(queries["claim"], literals), select) + " \\gset",
            "complete": substitute(queries["complete"], {"id": ":id", "attempt": ":attempt"}),
            "complete_many": substitute(queries["complete_many"], {"ids": ":ids", "attempts": ":attempts"}),
        }
        text = (BENCH / "pgbench" / template).read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        out = RESULTS / "pgbench" / template
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out

    def pgbench_once(self, script: Path, clients: int, n: int, per_txn: int) -> Run:
        fill_pgfence(self.main_dsn, n)
        info = psycopg.conninfo.conninfo_to_dict(self.main_dsn)
        out = self.logdir / f"pgbench-{script.stem}-c{clients}.out"
        # -M prepared: the protocol pgfence's workers use (the prepare setting).
        cmd = ["pgbench", "-n", "-M", "prepared", "-f", str(script), "-c", str(clients), "-j", str(min(2, clients)),
               "-t", str(n // (clients * per_txn)), "-h", str(info.get("host", "127.0.0.1")),
               "-p", str(info.get("port", 5432)), "-U", str(info.get("user", "postgres")), str(info["dbname"])]

        def start() -> list[subprocess.Popen]:
            return [subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT)]

        def stop(procs: list[subprocess.Popen]) -> None:
            # Done: pgbench ends with its last transaction.  Capped: stopped now.
            self.wait_exit(procs, timeout=5.0)

        run = drain(self.main_dsn, n, self.args.cap, start, self.probe, stop)
        text = out.read_text()
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
        if tps:
            # pgbench's own count, a cross-check of the database clock's.
            run.extra["pgbench_jobs_per_s"] = round(float(tps.group(1)) * per_txn, 1)
        elif not run.capped:
            raise RuntimeError(f"pgbench failed: {' | '.join(text.strip().splitlines()[-3:])}")
        return run

    def bench_pgbench(self) -> None:
        a = self.args
        one = self.render_pgbench("claim_complete.sql", 1)
        many = self.render_pgbench("claim_complete_many.sql", 50)
        log(f"pgbench scripts rendered with pgfence's SQL into {one.parent}")
        for clients in (4, 16):
            log(f"pgbench, pgfence claim of one job + fenced complete, -c {clients}, N={a.n_small:,}")
            self.measure(f"pgbench_one_c{clients}", "pgbench: pgfence claim 1 + complete",
                         f"-c {clients} -j 2 -M prepared",
                         a.n_small, lambda c=clients: self.pgbench_once(one, c, a.n_small, 1))
        for clients in (2, 4):
            log(f"pgbench, pgfence claim of 50 jobs + complete_many, -c {clients}, N={a.n:,}")
            self.measure(f"pgbench_batch50_c{clients}", "pgbench: pgfence claim 50 + complete_many",
                         f"-c {clients} -j 2 -M prepared", a.n,
                         lambda c=clients: self.pgbench_once(many, c, a.n, 50))

    # -- enqueue: jobs put in from Python, pgfence beside the peers (bench/enqueue_bench.py) ---------

    def bench_enqueue(self) -> None:
        self.metrics["enqueue"] = EnqueueSection(self).run()

    # -- django: Task.enqueue() over pgfence.enqueue, enqueue to SUCCESSFUL (bench/django_bench.py) ----

    def bench_django(self) -> None:
        calls, latency = (1000, 100) if self.args.quick else (5000, 300)
        log(f"Django tasks: Task.enqueue() beside pgfence.enqueue ({calls:,} calls, 4 rounds ABAB), "
            f"{latency} no-op tasks into an idle manage.py pgfence run: bench/django_bench.py")
        proc = subprocess.run([str(self.pgfence.python), str(BENCH / "django_bench.py"), "--dsn", self.args.admin_dsn,
                               "--calls", str(calls), "--rounds", "4", "--latency", str(latency), "--json"],
                              capture_output=True, text=True, cwd=BENCH, env=self.pgfence.env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip()[-500:])
        d = self.metrics["django"] = json.loads(proc.stdout.strip().splitlines()[-1])
        log(f"  Task.enqueue() +{d['task_enqueue_overhead_pct']}% over pgfence.enqueue; enqueue to SUCCESSFUL "
            f"p50 {d['latency_ms']['p50']} ms, p99 {d['latency_ms']['p99']} ms")

    # -- limits: what concurrency and rate limits cost (bench/limits_bench.py) --------------------

    def bench_limits(self) -> None:
        n, backlog = (4000, 100_000) if self.args.quick else (20_000, 1_000_000)
        log(f"Limits: {n:,} no-op jobs drained with no limit, a kind concurrency, a per-key limit over 10,000 "
            f"keys and a rate; claims beside {backlog:,} jobs held back: bench/limits_bench.py")
        proc = subprocess.run([str(self.pgfence.python), str(BENCH / "limits_bench.py"), "--dsn", self.args.admin_dsn,
                               "--n", str(n), "--backlog", str(backlog), "--json"],
                              capture_output=True, text=True, cwd=BENCH, env=self.pgfence.env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip()[-500:])
        d = self.metrics["limits"] = json.loads(proc.stdout.strip().splitlines()[-1])
        for way in ("kind", "key", "rate"):
            log(f"  {way}: {d['drain'][way]['jobs_per_s']:,.0f} jobs/s, {d['drain'][way]['of_unlimited_pct']}% of "
                f"unlimited ({d['drain']['none']['jobs_per_s']:,.0f})")
        log(f"  claim p50 with the backlog {d['backlog']['with']['p50_ms']} ms, without "
            f"{d['backlog']['without']['p50_ms']} ms")

    # -- io: jobs that wait (sleep, an HTTP call, a fenced row) -----------------------------------

    def start_http(self) -> subprocess.Popen:
        """The delaying HTTP server, in a process of its own; its port goes to
        every worker through PGFENCE_BENCH_HTTP_PORT."""
        port = free_port()
        proc = subprocess.Popen([str(BENCH_PY), "-m", "drivers.http_delay", str(port), str(self.args.io_wait_ms)],
                                cwd=BENCH, stdout=subprocess.PIPE, stderr=self.logfile("http"),
                                start_new_session=True, text=True)
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the HTTP server did not start; log: {self.tail('http')}")
        os.environ["PGFENCE_BENCH_HTTP_PORT"] = str(port)
        self.pgfence.env["PGFENCE_BENCH_HTTP_PORT"] = str(port)
        WORKLOAD_PIDS.append(proc.pid)
        return proc

    def io_series(self, key: str, system: str, config: str, n: int, once: Callable[[PoolMemory], Run],
                  slots: int) -> None:
        """measure() with the pool's memory sampled during each run; ``slots``
        is how many jobs the configuration runs at once (its ideal rate is
        slots / wait)."""
        self.metrics["io"].setdefault("slots", {})[key] = slots
        def run() -> Run:
            pool = PoolMemory()
            try:
                r = once(pool)
            finally:
                pool.stop()
            r.extra["memory"] = pool.result()
            return r
        self.measure(key, system, config, n, run, runs=self.args.io_runs)

    def pgfence_io_once(self, pool: PoolMemory, n: int, variant: str, workers: int, module: str,
                        many: list[str], env: dict | None = None) -> Run:
        fill_pgfence(self.main_dsn, n, f"io_{variant}")
        name = f"io-pgfence-{variant}-{'-'.join(many)}"

        def start() -> list[subprocess.Popen]:
            argv = ["run", "--dsn", self.main_dsn, "--workers", str(workers), *many, "--handlers", module,
                    "--metrics-port", "0", "--log-level", "WARNING"]
            saved = self.pgfence.env
            if env:
                self.pgfence.env = {**saved, **env}
            try:
                procs = [self.pgfence.popen(argv, self.logfile(name))]
            finally:
                self.pgfence.env = saved
            pool.start(procs)
            return procs

        def stop(procs: list[subprocess.Popen]) -> None:
            pool.stop()
            for p in procs:
                stop_process(p, signal.SIGTERM)

        try:
            return drain(self.main_dsn, n, self.args.cap, start, self.probe, stop)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; log: {self.tail(name)}") from None

    def bench_io(self) -> None:
        a = self.args
        wait, n = a.io_wait_ms, a.io_n
        http = self.start_http()
        try:
            self._bench_io(wait, n)
        finally:
            WORKLOAD_PIDS.remove(http.pid)
            stop_process(http, signal.SIGTERM, 5)

    def _bench_io(self, wait: int, n: int) -> None:
        a = self.args
        os.environ["PGFENCE_BENCH_IO_WAIT_MS"] = str(wait)
        self.pgfence.env["PGFENCE_BENCH_IO_WAIT_MS"] = str(wait)
        self.metrics["io"] = {"wait_ms": wait, "n": n}
        sync_mod, async_mod = "bench.drivers.pgfence_io_sync", "bench.drivers.pgfence_io_async"
        # pgfence: threads, then async; every variant at the main configuration.
        configs = [("threads", 2, ["--threads", "32"], sync_mod, tuple(IO_VARIANTS)),
                   ("threads", 2, ["--threads", "16"], sync_mod, ("sleep",)),
                   ("async", 2, ["--async-concurrency", "200"], async_mod, tuple(IO_VARIANTS)),
                   ("async", 2, ["--async-concurrency", "500"], async_mod, ("sleep",))]
        for side, workers, many, module, variants in configs:
            if f"pgfence-{side}" not in a.io_systems:
                continue
            for variant in variants:
                config = f"--workers {workers} {' '.join(many)}"
                key = f"io_pgfence_{side}_w{workers}_{many[1]}_{variant}"
                log(f"io: pgfence {side}, {config}, {variant} {wait} ms, N={n:,}")
                self.io_series(key, f"pgfence {side}, {IO_VARIANTS[variant]}", config, n,
                               lambda pool, v=variant, w=workers, m=many, mod=module:
                               self.pgfence_io_once(pool, n, v, w, mod, m), workers * int(many[1]))
        if a.io_gc_freeze and "pgfence-async" in a.io_systems:
            # gc.freeze() is always on in the arbiter; a sitecustomize on
            # PYTHONPATH (bench/nofreeze) makes it a no-op for one comparison.
            nofreeze = {"PYTHONPATH": str(BENCH / "nofreeze")}
            log(f"io: pgfence async, --workers 2 --async-concurrency 200, sleep, gc.freeze() disabled, N={n:,}")
            self.io_series("io_pgfence_async_w2_200_sleep_nofreeze", "pgfence async (gc.freeze() off), sleep",
                           "--workers 2 --async-concurrency 200", n,
                           lambda pool: self.pgfence_io_once(pool, n, "sleep", 2, async_mod,
                                                             ["--async-concurrency", "200"], nofreeze), 400)
        # The one-job pgbench reference of the fenced-row goal (16 clients).
        if "pgbench_one_c16" not in self.series and "pgbench" in a.io_systems:
            one = self.render_pgbench("claim_complete.sql", 1)
            nb = max(2000, n) // 16 * 16      # pgbench runs N / 16 transactions per client: none left over
            log(f"io: pgbench, pgfence claim of one job + fenced complete, -c 16, N={nb:,} (the fenced-row reference)")
            self.measure("pgbench_one_c16", "pgbench: pgfence claim 1 + complete", "-c 16 -j 2 -M prepared", nb,
                         lambda: self.pgbench_once(one, 16, nb, 1))
        for system in ("pgqueuer", "procrastinate", "celery", "dramatiq"):
            if system in a.io_systems:
                getattr(self, f"io_{system}")(n)

    def io_pgqueuer(self, n: int) -> None:
        a = self.args
        dsn = self.server.create("io_pgqueuer")
        probe = PGQUEUER_PROBE
        batch, most = a.io_pgqueuer_batch, a.io_pgqueuer_concurrency
        for processes, variant in ((1, "sleep"), (2, "sleep"), (2, "http")):
            entry = f"io_{variant}"
            name = f"io-pgqueuer-{variant}-{processes}"
            config = f"{processes} process{'es' if processes > 1 else ''}, batch {batch}, max_concurrent_tasks {most}"
            log(f"io: pgqueuer (asyncpg), {config}, {variant}, N={n:,}")

            def once(pool: PoolMemory, processes=processes, entry=entry, name=name) -> Run:
                subprocess.run([str(BENCH_PY), "-m", "drivers.pgqueuer_worker", "setup", dsn, str(n), entry],
                               cwd=BENCH, check=True, stdout=self.logfile(name), stderr=subprocess.STDOUT)
                execute(dsn, "VACUUM ANALYZE pgqueuer", "VACUUM ANALYZE pgqueuer_log", "CHECKPOINT")

                def start() -> list[subprocess.Popen]:
                    procs = [self.start_driver("pgqueuer_worker", "work", dsn, "apg", str(batch), entry, str(most),
                                               name=name) for _ in range(processes)]
                    pool.start(procs)
                    return procs
                return drain(dsn, n, a.cap, start, probe, self.wait_exit)

            self.io_series(f"io_pgqueuer_p{processes}_{variant}", f"pgqueuer, {IO_VARIANTS[variant]}", config, n, once,
                           processes * most)

    def io_procrastinate(self, n: int) -> None:
        a = self.args
        dsn = self.server.create("io_procrastinate")
        n = max(500, n // 2)             # far slower: keeps it within the cap
        processes, concurrency = 2, a.io_procrastinate_concurrency
        probe = PROCRASTINATE_PROBE
        config = f"{processes} processes, concurrency {concurrency}"
        log(f"io: procrastinate, {config}, sleep, N={n:,}")

        def once(pool: PoolMemory) -> Run:
            subprocess.run([str(BENCH_PY), "-m", "drivers.procrastinate_worker", "setup", dsn, str(n), "io_sleep"],
                           cwd=BENCH, check=True, stdout=self.logfile("io-procrastinate"), stderr=subprocess.STDOUT)
            execute(dsn, "VACUUM ANALYZE procrastinate_jobs", "CHECKPOINT")

            def start() -> list[subprocess.Popen]:
                procs = [self.start_driver("procrastinate_worker", "work", dsn, str(concurrency),
                                           name="io-procrastinate") for _ in range(processes)]
                pool.start(procs)
                return procs
            return drain(dsn, n, a.cap, start, probe, self.wait_exit)

        self.io_series("io_procrastinate_sleep", "procrastinate, sleep", config, n, once, processes * concurrency)

    def redis_once(self, pool: PoolMemory, module: str, url: str, n: int, task: str, worker: list[str],
                   name: str) -> Run:
        """Celery or Dramatiq: N tasks sent first, then the workers started;
        each task records its start and end (drivers.redisclock)."""
        import redis as _redis  # noqa: F401 - fail early if the venv lacks it

        from drivers import redisclock
        env = {**os.environ}
        subprocess.run([str(BENCH_PY), "-m", f"drivers.{module}", "setup", str(n), task], cwd=BENCH, check=True,
                       stdout=self.logfile(name), stderr=subprocess.STDOUT, env=env)

        def start() -> list[subprocess.Popen]:
            procs = [subprocess.Popen([str(BENCH_PY), "-m", *worker], cwd=BENCH, stdout=self.logfile(name),
                                      stderr=subprocess.STDOUT, start_new_session=True, env=env)]
            pool.start(procs)
            return procs

        def stop(procs: list[subprocess.Popen]) -> None:
            pool.stop()
            for p in procs:
                stop_process(p, signal.SIGTERM, 15)

        try:
            return drain_counted(n, self.args.cap, start, stop, lambda: redisclock.done(url),
                                 lambda: redisclock.window(url))
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; log: {self.tail(name)}") from None

    def io_celery(self, n: int) -> None:
        url = os.environ.setdefault("PGFENCE_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/11")
        base = ["celery", "-A", "drivers.celery_io", "worker", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "--loglevel", "WARNING"]
        # Prefork at 8 processes runs about 8 / 0.05 = 160 tasks/s at best: a smaller N.
        for pool_name, c, variant, count in (("threads", 64, "sleep", n), ("threads", 64, "http", n),
                                              ("prefork", 8, "sleep", max(300, n * 3 // 10))):
            config = f"--pool {pool_name} -c {c}, Redis broker"
            log(f"io: Celery, {config}, {variant}, N={count:,}")
            self.io_series(f"io_celery_{pool_name}{c}_{variant}", f"Celery 5, {IO_VARIANTS[variant]}", config, count,
                           lambda pool, v=variant, p=pool_name, c=c, count=count:
                           self.redis_once(pool, "celery_io", url, count, f"io_{v}",
                                           [*base, "--pool", p, "-c", str(c)], f"io-celery-{p}-{v}"), c)

    def io_dramatiq(self, n: int) -> None:
        url = os.environ.setdefault("PGFENCE_BENCH_DRAMATIQ_BROKER", "redis://127.0.0.1:6379/12")
        processes, threads = 2, 32
        config = f"--processes {processes} --threads {threads}, Redis broker"
        for variant in ("sleep", "http"):
            log(f"io: Dramatiq, {config}, {variant}, N={n:,}")
            self.io_series(f"io_dramatiq_p{processes}t{threads}_{variant}", f"Dramatiq 2, {IO_VARIANTS[variant]}",
                           config, n,
                           lambda pool, v=variant: self.redis_once(
                               pool, "dramatiq_io", url, n, f"io_{v}",
                               ["dramatiq", "drivers.dramatiq_io", "--processes", str(processes),
                                "--threads", str(threads)], f"io-dramatiq-{v}"), processes * threads)

    # -- pickup latency ----------------------------------------------------------------

    def pickup(self, count: int, gap: float, *extra: str) -> dict:
        """Enqueue ``count`` jobs one at a time, ``gap`` apart (jittered), into
        an idle pool of 4; started_at - created_at on the database clock."""
        fill_pgfence(self.main_dsn, 0)
        name = "pickup" + "".join(extra).replace("-", "")
        proc = self.pgfence.run(self.main_dsn, 4, 1, self.logfile(name), *extra)
        try:
            with psycopg.connect(self.main_dsn, autocommit=True) as conn:
                idle = ("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgfence worker%' "
                        "AND state = 'idle'")
                if not wait_for(lambda: conn.execute(idle).fetchone()[0] >= 4, 30):
                    raise RuntimeError(f"the workers did not come up; log: {self.tail(name)}")
                time.sleep(1.0)
                for _ in range(count):
                    conn.execute("SELECT pgfence.enqueue('noop')")
                    time.sleep(gap * random.uniform(0.5, 1.5))
                if not wait_for(lambda: not conn.execute(self.probe.left).fetchone()[0], 30):
                    raise RuntimeError("jobs were left unclaimed")
                ms = sorted(r[0] for r in conn.execute(
                    "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 FROM "
                    + all_jobs(self.main_dsn)))
        finally:
            stop_process(proc, signal.SIGTERM)
        return {"jobs": len(ms), "gap_ms": gap * 1000, "options": " ".join(extra),
                "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99),
                "max_ms": ms[-1], "mean_ms": statistics.fmean(ms)}

    def bench_pickup(self) -> None:
        log("pickup latency: 200 jobs enqueued one at a time into an idle pool of 4 (LISTEN/NOTIFY)")
        p = self.metrics["pickup"] = self.pickup(200, 0.05)
        log(f"  p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, max {p['max_ms']:.2f} ms")
        log("pickup latency with --no-listen --poll-interval 100ms (polling, for comparison), 100 jobs")
        p = self.metrics["pickup_no_listen"] = self.pickup(100, 0.05, "--no-listen", "--poll-interval", "100ms")
        log(f"  p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, max {p['max_ms']:.2f} ms")

    # -- lease renewal ------------------------------------------------------------------

    def bench_heartbeat(self) -> None:
        log("lease renewal: HeartbeatManager.run_once with 1,000 leases, 20 rounds")
        proc = subprocess.run([str(self.pgfence.python), str(BENCH / "pgfence_probe.py"), "heartbeat",
                               self.main_dsn, "1000", "20"],
                              capture_output=True, text=True, cwd=self.pgfence.root, env=self.pgfence.env,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip()[-500:])
        h = self.metrics["heartbeat"] = json.loads(proc.stdout)
        log(f"  median {h['median_ms']:.2f} ms, {h['statements_for_rounds']} statements for {h['rounds']} rounds; "
            f"thread: {h['thread_statements']} statements in {h['thread_span_s']} s at {h['thread_interval_s']} s")

    # -- claim cost with a million finished rows -------------------------------------------

    def bench_claim(self) -> None:
        a = self.args
        empty, big = self.server.create("claim_empty"), self.server.create("claim_1m")
        for dsn in (empty, big):
            self.pgfence.migrate(dsn)
        log(f"claim cost: {a.finished_rows:,} finished rows")
        insert_history(big, a.finished_rows, has_history(big))
        claims, warmup = a.claims, 100
        for dsn in (empty, big):
            execute(dsn, f"INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, {claims + warmup})",
                    "VACUUM ANALYZE pgfence.jobs", "CHECKPOINT")
        queries = self.pgfence.queries()
        claim, complete = queries["claim"], queries["complete"]
        conns = {"empty": psycopg.connect(empty, autocommit=True, prepare_threshold=None),
                 "1m": psycopg.connect(big, autocommit=True, prepare_threshold=None)}
        plans: dict[str, list[str]] = {}
        try:
            for label, conn in conns.items():
                with conn.transaction(force_rollback=True):
                    plan = " ".join(r[0] for r in conn.execute("EXPLAIN " + claim, claim_params(1)))
                plans[label] = sorted(set(re.findall(
                    r"((?:Seq|Index|Index Only|Bitmap Heap) Scan(?: using \w+)?) on jobs", plan)))
            log(f"claim cost: {claims:,} claims of one job on each table (after {warmup} warm-up), interleaved")
            times = time_claims(conns, claim, complete, claims, warmup)
        finally:
            for conn in conns.values():
                conn.close()
        med = {k: statistics.median(v) for k, v in times.items()}
        c = self.metrics["claim"] = {
            "finished_rows": a.finished_rows, "queued": claims + warmup, "claims": claims,
            "empty_median_ms": med["empty"], "empty_p90_ms": percentile(sorted(times["empty"]), 90),
            "1m_median_ms": med["1m"], "1m_p90_ms": percentile(sorted(times["1m"]), 90),
            "ratio": med["1m"] / med["empty"], "plans": plans,
        }
        log(f"  median {c['1m_median_ms']:.3f} ms with the finished rows, {c['empty_median_ms']:.3f} ms without: "
            f"{c['ratio']:.2f}x; plans {plans}")

    # -- the dashboard's pages over a million jobs ---------------------------------------------

    def bench_web(self) -> None:
        jobs = 100_000 if self.args.quick else 1_000_000
        log(f"dashboard pages (pgfence web) over {jobs:,} jobs: bench/web_pages.py")
        proc = subprocess.run([str(self.pgfence.python), str(BENCH / "web_pages.py"), self.args.admin_dsn, str(jobs),
                               "--json"], capture_output=True, text=True, cwd=BENCH, env=self.pgfence.env,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip()[-500:])
        w = self.metrics["web"] = json.loads(proc.stdout.strip().splitlines()[-1])
        log("  " + ", ".join(f"{label} {ms:.1f} ms" for label, ms in w["pages_ms"].items()))
        log(f"a bulk retry of {jobs:,} failed jobs from the dashboard, a stream claimed meanwhile: bench/bulk_retry.py")
        proc = subprocess.run([str(self.pgfence.python), str(BENCH / "bulk_retry.py"), "--dsn", self.args.admin_dsn,
                               "--jobs", str(jobs), "--json"], capture_output=True, text=True, cwd=BENCH,
                              env=self.pgfence.env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip()[-500:])
        b = self.metrics["bulk"] = json.loads(proc.stdout.strip().splitlines()[-1])
        log(f"  POST {b['post_s'] * 1000:.1f} ms, {b['acted']:,} retried in {b['duration_s']:.1f} s; claim latency "
            f"p99 {b['latency_before']['p99_ms']:.2f} ms before, {b['latency_during']['p99_ms']:.2f} ms during")

    # -- memory ----------------------------------------------------------------------------

    def bench_memory(self) -> None:
        log("memory: pgfence run --workers 4 (metrics endpoint on) after 4,000 no-op jobs")
        fill_pgfence(self.main_dsn, 4000)
        proc = self.pgfence.popen(["run", "--dsn", self.main_dsn, "--workers", "4", "--handlers",
                                   "pgfence.handlers.builtin", "--metrics-port", str(free_port()),
                                   "--log-level", "WARNING"], self.logfile("memory"))
        try:
            with psycopg.connect(self.main_dsn, autocommit=True) as conn:
                if not wait_for(lambda: not conn.execute(self.probe.left).fetchone()[0], 60):
                    raise RuntimeError(f"jobs were left; log: {self.tail('memory')}")
            time.sleep(2.0)
            procs = [{"pid": proc.pid, "role": "arbiter", "title": cmdline(proc.pid)[:80], **memory(proc.pid)}]
            for pid in descendants(proc.pid):
                title = cmdline(pid)
                role = next((r for r in ("worker", "heartbeat", "metrics") if r in title), title[:40])
                procs.append({"pid": pid, "role": role, "title": title[:80], **memory(pid)})
        finally:
            stop_process(proc, signal.SIGTERM)
        workers = [p for p in procs if p["role"] == "worker"]
        m = self.metrics["memory"] = {
            "processes": procs, "workers": len(workers),
            "worker_rss_mib": statistics.median(p["rss_mib"] for p in workers),
            "worker_uss_mib": statistics.median(p["uss_mib"] for p in workers),
            "worker_pss_mib": statistics.median(p["pss_mib"] for p in workers),
            "arbiter_rss_mib": procs[0]["rss_mib"], "arbiter_uss_mib": procs[0]["uss_mib"],
            "total_uss_mib": round(sum(p["uss_mib"] for p in procs), 2),
            "total_pss_mib": round(sum(p["pss_mib"] for p in procs), 2),
        }
        log(f"  worker RSS {m['worker_rss_mib']:.1f} MiB, USS {m['worker_uss_mib']:.1f} MiB; "
            f"arbiter RSS {m['arbiter_rss_mib']:.1f} MiB, USS {m['arbiter_uss_mib']:.1f} MiB")

    # -- profile ------------------------------------------------------------------------------

    def bench_profile(self) -> None:
        """py-spy on one worker of the best no-op configuration while it drains."""
        best = max((s for k, s in self.series.items() if k.startswith("pgfence_noop") and s.runs),
                   key=lambda s: s.rate, default=None)
        if best is None:
            log("profile: skipped, no pgfence no-op figure to pick the configuration from")
            return
        workers, batch = map(int, re.search(r"--workers (\d+) --batch (\d+)", best.config).groups())
        n = max(100_000, int(best.rate * 6))      # enough to keep it busy past the 3 s recorded
        log(f"profile: py-spy on one worker of --workers {workers} --batch {batch}, N={n:,}")
        fill_pgfence(self.main_dsn, n)
        raw = self.logdir / "profile.raw"
        proc = self.pgfence.run(self.main_dsn, workers, batch, self.logfile("profile"))
        try:
            with psycopg.connect(self.main_dsn, autocommit=True) as conn:
                wait_for(lambda: conn.execute(self.probe.started).fetchone()[0], 30, 0.01)
            kids = [p for p in descendants(proc.pid) if "worker" in cmdline(p)]
            spy = subprocess.run([str(BENCH_PY.parent / "py-spy"), "record", "-p", str(kids[0]), "-d", "3",
                                  "-r", "250", "--idle", "--nonblocking", "-f", "raw", "-o", str(raw)],
                                 capture_output=True, text=True, check=False)
        finally:
            stop_process(proc, signal.SIGTERM)
        if spy.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed: {spy.stderr.strip()[-300:]}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "profile.folded").write_text(raw.read_text())
        self.metrics["profile"] = {"config": f"--workers {workers} --batch {batch}", "n": n, **fold(raw.read_text())}

    # -- soak: a steady offered rate on the embedded server ---------------------------------------

    def bench_soak(self) -> None:
        self.metrics["soak"] = Soak(self).run()

    # -- the whole run ---------------------------------------------------------------------------

    def run(self) -> dict:
        started = time.time()
        others = self.server.admin(
            "SELECT datname, count(*) FROM pg_stat_activity WHERE datname IS NOT NULL "
            f"AND datname NOT LIKE '{PREFIX}%' AND pid <> pg_backend_pid() GROUP BY 1 ORDER BY 1")
        load = os.getloadavg()
        if others or load[0] > 1.0:
            log(f"the machine is not idle: load average {load[0]:.1f}; sessions in other databases: "
                f"{dict(others) or 'none'}; each run waits for a quiet machine and marks a disturbed one")
        self.server.drop_leftovers()
        self.main_dsn = self.server.create("main")
        self.pgfence.migrate(self.main_dsn)
        self.probe = pgfence_probe(self.main_dsn)
        try:
            for name in SECTIONS:
                if name not in self.args.only:
                    continue
                try:
                    getattr(self, f"bench_{name}")()
                except Exception as exc:  # noqa: BLE001 - report it, and go on with the others
                    self.errors[name] = f"{type(exc).__name__}: {exc}"
                    log(f"{name}: FAILED: {self.errors[name]}")
        finally:
            if not self.args.keep:
                self.server.drop_all()
        for key, s in self.series.items():
            if s.error:
                self.errors[key] = s.error
        return {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["bench/run.sh", *self.args.argv]),
            "elapsed_s": round(time.time() - started, 1),
            "machine": machine_facts(self.server),
            "pgfence": self.pgfence.describe(),
            "settings": {"n": self.args.n, "n_small": self.args.n_small, "runs": self.args.runs,
                         "cap_s": self.args.cap, "io_runs": self.args.io_runs or self.args.runs,
                         "io_wait_ms": self.args.io_wait_ms, "io_n": self.args.io_n},
            "throughput": {k: s.as_dict() for k, s in self.series.items()},
            "metrics": self.metrics,
            "goals": goals(self.series, self.metrics),
            "errors": self.errors,
            "at_start": {"load_average": load, "other_sessions": dict(others)},
            "logs": str(self.logdir),
        }


# -- pgfence's SQL for pgbench -------------------------------------------------------------------


def substitute(sql: str, values: dict[str, str]) -> str:
    """pgfence's psycopg-style statement with literals in place of %(name)s."""
    out = re.sub(r"%\((\w+)\)s", lambda m: values[m.group(1)], sql).replace("%%", "%")
    if "%(" in out:
        raise ValueError(f"unfilled parameter in {out[:80]}")
    return out


def wrap_returning(sql: str, select: str) -> str:
    """Turn ``[WITH ...] UPDATE ... RETURNING ...`` into a statement whose one
    row (``select`` over a CTE named ``bench_claimed``, a name the claim's
    own CTEs do not use) pgbench can \\gset.  A WITH
    that holds a data-modifying statement must be top-level, so the
    statement's own CTEs are kept and it joins them as one more."""
    text = sql.strip().rstrip(";")
    if not re.match(r"(?is)^with\s", text):
        return f"WITH bench_claimed AS (\n{text}\n)\n{select}"
    depth, i, main = 0, 4, None
    while i < len(text):
        ch = text[i]
        if ch == "'":                       # skip a literal, '' included
            i = text.index("'", i + 1) + 1
            while i < len(text) and text[i] == "'":
                i = text.index("'", i + 1) + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and not text[i + 1:].lstrip().startswith(","):
                main = i + 1
                break
        i += 1
    if main is None:
        raise ValueError("cannot find the claim's main statement")
    return f"{text[:main]},\nbench_claimed AS (\n{text[main:].strip()}\n)\n{select}"


# -- command line --------------------------------------------------------------------------------


def _interrupted(signum: int, _frame: object) -> None:
    # SIGTERM like Ctrl-C: the finally blocks stop the workers and drop the databases.
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    args = parse_args(argv)
    harness.QUIET_TIMEOUT[0] = args.quiet_timeout
    if not Path(args.project_python).exists():
        print(f"bench: {args.project_python} not found: run bench/run.sh, which installs pgfence", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = Bench(args).run()
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    text = markdown(report)
    (RESULTS / "latest.md").write_text(text + "\n")
    print(text)
    log(f"results: {args.json} and {RESULTS / 'latest.md'}; logs: {report['logs']}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
