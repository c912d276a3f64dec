"""``pgfence loadtest``'s options as the command line declares them; the
load test (pgfence.tools.loadtest.options) validates their values.  Declared
here, not in the tool, so that building the parser of any command imports
nothing of pgfence.tools."""

from __future__ import annotations

import argparse

#: Every fault of the load test, in the order its report lists them.
FAULTS = ("stop", "kill", "kill-heartbeat", "terminate", "partition", "restart", "xmin")


DEFAULT_MIX = "noop=40,sleep=30,fail=10,effect=10,receipt=10"


def add_loadtest_arguments(p: argparse.ArgumentParser) -> None:
    """``pgfence loadtest``'s options (validated by pgfence.tools.loadtest.options)."""
    p.add_argument("--jobs", default="1000", help="jobs to enqueue (default 1000)")
    p.add_argument("--supervisors", default="2", help="`pgfence run` processes (default 2)")
    p.add_argument("--workers", default="4", help="worker children per supervisor (default 4)")
    p.add_argument("--batch", default=None,
                   help="jobs a worker claims per statement (default: its free slots, 1 for one thread)")
    p.add_argument("--threads", default="1",
                   help="jobs of def handlers each worker runs at once, one thread each (default 1)")
    p.add_argument("--async-concurrency", default="100",
                   help="jobs of async def handlers (asleep, aeffect) each worker runs at once (default 100)")
    p.add_argument("--mix", default=DEFAULT_MIX,
                   help="job types and weights, NAME=WEIGHT comma-separated (noop, sleep, fail, effect, receipt, "
                        "asleep, aeffect, limited, keyed); the limited ones work like sleep under a concurrency "
                        "limit: limited=W@N at most N at once, keyed=W@N/K at most N at once of one concurrency "
                        "key, spread over K keys, keyed=W@M:N/K and at most M at once in all; the audit checks "
                        f"the limits held (default {DEFAULT_MIX})")
    p.add_argument("--sleep-mean", default="0.5",
                   help="mean seconds of sleep/effect/receipt/asleep/aeffect jobs, exponentially distributed "
                        "(default 0.5)")
    p.add_argument("--sleep-max", default="5", help="longest such job in seconds (default 5)")
    p.add_argument("--lease", default="5", help="the supervisors' lease in seconds (default 5)")
    p.add_argument("--poll-interval", default="1", help="the supervisors' poll interval (default 1)")
    p.add_argument("--faults", default="none",
                   help=f"comma-separated faults to inject: {','.join(FAULTS)}, or all, or none (default none)")
    p.add_argument("--fault-interval", default="5",
                   help="mean seconds between faults, each drawn from half to one and a half of it (default 5)")
    p.add_argument("--xmin-hold", default=None,
                   help="seconds the xmin fault holds the horizon (default: 1.5 to 2.5 leases, drawn per fault)")
    p.add_argument("--seed", help="seed of the job mix and the fault schedule (default: random, reported)")
    p.add_argument("--timeout", default="600", help="seconds to wait for every job to end (default 600)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="FILE", help="write a PNG chart of throughput and reclaims (needs matplotlib)")
    p.add_argument("--progress", action="store_true", help="show the progress line even when stderr is no terminal")
    p.add_argument("--pgbouncer", action="store_true",
                   help="put a PgBouncer in transaction pooling in front of the server (workers poll)")
    p.add_argument("--embedded", action="store_true",
                   help="run against a throwaway embedded PostgreSQL (enables the restart fault)")
    p.add_argument("--log-dir", help="keep the supervisors' logs here (default: a temp dir, removed)")
    # UNSAFE, for the test that shows the audit catching a double commit:
    # the supervisors run `pgfence run --unprotected` (no renewal, no fence).
    p.add_argument("--unprotected", action="store_true", help=argparse.SUPPRESS)
