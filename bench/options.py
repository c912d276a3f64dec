"""The benchmark's command line, declared apart from the benchmark so that
``bench/run.sh --help`` prints it with the system's Python, before (and
without) installing anything: standard library only."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
DESCRIPTION = ("The pgfence benchmark: throughput, enqueue calls, pickup latency, lease renewal, claim cost and "
               "memory, side by side with pgqueuer, procrastinate, a naive psycopg loop and pgbench running "
               "pgfence's own statements, on the same PostgreSQL.")
SECTIONS = ("pgfence", "effect", "pgqueuer", "procrastinate", "naive", "pgbench", "enqueue", "django", "limits", "io",
            "pickup", "heartbeat", "claim", "web", "memory", "profile", "soak")
#: Sections run only when --only names them: the soak section alone lasts
#: over an hour at its defaults; the limits one (bench/limits_bench.py)
#: measures pgfence against itself.
OPT_IN = ("soak", "limits")
#: The soak section's settings: (default, --quick) for each option not given.
SOAK_DEFAULTS = {"soak_minutes": (30.0, 1.0), "soak_probe_s": (120.0, 20.0), "soak_probes": (4, 3),
                 "soak_window_s": (30.0, 10.0), "soak_probe_window_s": (10.0, 5.0),
                 "soak_burst_n": (100_000, 20_000), "soak_history_rows": (10_000_000, 500_000)}
#: The io section's systems (--io-systems picks some); pgbench is the
#: fenced-row goal's reference.
IO_SYSTEMS = ("pgfence-threads", "pgfence-async", "pgbench", "pgqueuer", "procrastinate", "celery", "dramatiq")

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.sh", description=DESCRIPTION)
    p.add_argument("--admin-dsn", default=os.environ.get("PGFENCE_BENCH_DSN",
                                                         "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="a superuser on the server under test (default: postgres@127.0.0.1:5432)")
    p.add_argument("--pgfence-root", default=str(BENCH.parent),
                   help="the pgfence checkout to measure (default: this repository)")
    p.add_argument("--project-python", default=os.environ.get("PGFENCE_BENCH_PROJECT_PYTHON",
                                                              str(BENCH.parent / ".venv" / "bin" / "python")),
                   help="the interpreter that has pgfence's dependencies (default: .venv/bin/python)")
    p.add_argument("--n", type=int, default=50_000, help="jobs per batched no-op run (default 50,000)")
    p.add_argument("--n-small", type=int, default=20_000,
                   help="jobs per run for one-job-per-claim runs, effect jobs, pgqueuer's psycopg driver "
                        "and procrastinate (default 20,000)")
    p.add_argument("--runs", type=int, default=3, help="runs per throughput figure; the median is shown (default 3)")
    p.add_argument("--cap", type=float, default=30.0,
                   help="seconds after which a throughput run is stopped and its rate taken so far (default 30)")
    p.add_argument("--claims", type=int, default=1000, help="claims timed on each table (default 1,000)")
    p.add_argument("--finished-rows", type=int, default=1_000_000, help="finished rows for the claim cost")
    p.add_argument("--procrastinate-concurrency", type=int, default=10)
    p.add_argument("--io-wait-ms", type=int, default=50, help="the io section's wait per job, ms (default 50)")
    p.add_argument("--io-n", type=int, default=5000,
                   help="jobs per io run (default 5,000; procrastinate half, Celery prefork 30%%)")
    p.add_argument("--io-runs", type=int, help="runs per io figure (default: --runs)")
    p.add_argument("--enqueue-n", type=int, default=5000,
                   help="jobs per run of the enqueue section's one-job calls (default 5,000)")
    p.add_argument("--enqueue-many-n", type=int, default=100_000,
                   help="jobs per run of the enqueue section's batches of 10,000 (default 100,000)")
    p.add_argument("--io-pgqueuer-batch", type=int, default=50)
    p.add_argument("--io-pgqueuer-concurrency", type=int, default=500, help="pgqueuer's max_concurrent_tasks")
    p.add_argument("--io-procrastinate-concurrency", type=int, default=100, help="per process")
    p.add_argument("--no-io-gc-freeze", dest="io_gc_freeze", action="store_false",
                   help="skip the io run with gc.freeze() disabled")
    p.add_argument("--io-systems", default=",".join(IO_SYSTEMS),
                   help=f"comma-separated systems the io section runs (default: all of {','.join(IO_SYSTEMS)}), "
                        "e.g. pgfence-async,pgqueuer to iterate on one comparison")
    p.add_argument("--quiet-timeout", type=float, default=120.0,
                   help="seconds each run waits at most for a quiet machine (default 120; 0 on a machine that is "
                        "never quiet: the runs are then marked disturbed, and only ratios within the run compare)")
    # The soak options: --quick shortens those not given.
    p.add_argument("--soak-minutes", type=float,
                   help="the soak section's full run at the rate found, minutes (default 30; quick 1)")
    p.add_argument("--soak-probe-s", type=float,
                   help="each probe of the soak section's search for the sustained rate, seconds (default 120; "
                        "quick 20)")
    p.add_argument("--soak-probes", type=int, help="probes in that search (default 4; quick 3)")
    p.add_argument("--soak-window-s", type=float, help="the full run's sampling window, s (default 30; quick 10)")
    p.add_argument("--soak-probe-window-s", type=float, help="a probe's sampling window, s (default 10; quick 5)")
    p.add_argument("--soak-burst-n", type=int, help="jobs drained for the burst figure (default 100,000; quick 20,000)")
    p.add_argument("--soak-history-rows", type=int,
                   help="simulated finished jobs for the claim and renewal cost vs history size (default "
                        "10,000,000, quick 500,000; 100,000,000 for the issue's figure, about 60 GB on a schema "
                        "that keeps finished jobs in pgfence.jobs)")
    p.add_argument("--only", default=",".join(s for s in SECTIONS if s not in OPT_IN),
                   help=f"comma-separated sections to run (default: all of {','.join(SECTIONS)} but "
                        f"{','.join(OPT_IN)})")
    p.add_argument("--pgfence-configs", dest="configs",
                   help="pgfence no-op configurations as WORKERSxBATCH, comma-separated, batch 0 for no --batch "
                        "(default 4x0,2x1,4x1,2x50,4x50,2x100,4x100,2x200,4x200)")
    p.add_argument("--quick", action="store_true", help="a smoke run: small N, one run each, fewer configurations")
    p.add_argument("--keep", action="store_true", help="keep the pgfence_bench_* databases")
    p.add_argument("--json", default=str(RESULTS / "latest.json"), help="where to write the JSON results")
    args = p.parse_args(argv)
    args.argv = argv
    args.only = set(args.only.split(","))
    unknown = args.only - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    args.io_systems = set(args.io_systems.split(","))
    unknown = args.io_systems - set(IO_SYSTEMS)
    if unknown:
        p.error(f"unknown io system(s): {', '.join(sorted(unknown))}")
    args.pgfence_configs = [(4, 0), (2, 1), (4, 1), (2, 50), (4, 50), (2, 100), (4, 100), (2, 200), (4, 200)]
    args.effect_batches = [1, 50]
    if args.quick:
        args.n, args.n_small, args.runs, args.claims, args.finished_rows = 4000, 2000, 1, 200, 100_000
        args.pgfence_configs = [(4, 0), (4, 1), (2, 100)]
        args.io_n = 600
        args.enqueue_n, args.enqueue_many_n = 1000, 20_000
        args.effect_batches = [1]
    for name, (full, quick) in SOAK_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        elif getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.configs:
        try:
            args.pgfence_configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
        except ValueError:
            p.error("--pgfence-configs: give WORKERSxBATCH pairs like 2x100,4x200")
    return args


if __name__ == "__main__":
    parse_args(sys.argv[1:])
