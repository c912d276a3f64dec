"""The load test's options, validated into a :class:`Plan` before anything
starts: a bad value is one ``pgfence: error:`` line and exit status 2."""

from __future__ import annotations

import argparse
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any

from pgfence.cli.loadtest_flags import FAULTS
from pgfence.errors import ConfigError
from pgfence.settings import ASYNC_CONCURRENCY_MAX, THREADS_MAX, parse_duration
from pgfence.tools.loadtest import mix as mix_mod


@dataclass(frozen=True)
class Plan:
    jobs: int
    supervisors: int
    workers: int
    #: ``--batch``; None: not passed, each worker claims up to its free slots.
    batch: int | None
    threads: int
    async_concurrency: int
    weights: dict[str, int]
    counts: dict[str, int]
    #: The limited mixes that have jobs: their limits, by mix name.
    limits: dict[str, mix_mod.Limit]
    sleep_mean: float
    sleep_max: float
    lease: float
    poll_interval: float
    faults: tuple[str, ...]
    fault_interval: float
    #: Seconds the xmin fault holds the horizon; None: drawn like a stop's.
    xmin_hold: float | None
    seed: int
    timeout: float
    json: bool
    plot: str | None
    progress: bool
    pgbouncer: bool
    embedded: bool
    dsn: str | None
    log_dir: str | None
    unprotected: bool

    @property
    def with_async(self) -> bool:
        """The mix has async jobs: the workers load the async handlers and
        run an event loop."""
        return mix_mod.needs_async(self.weights)

    @property
    def capacity(self) -> int:
        """Jobs one worker child runs at once."""
        return self.threads + (self.async_concurrency if self.with_async else 0)

    @property
    def claim_size(self) -> int:
        """The most jobs one claim statement of a worker takes."""
        return self.batch if self.batch is not None else self.capacity

    def describe(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs, "supervisors": self.supervisors, "workers": self.workers, "batch": self.batch,
            "threads": self.threads, "async_concurrency": self.async_concurrency, "capacity": self.capacity,
            "mix": dict(self.weights), "counts": dict(self.counts),
            "limits": {name: limit.describe(name) for name, limit in self.limits.items()},
            "sleep_mean": self.sleep_mean, "sleep_max": self.sleep_max,
            "lease": self.lease, "poll_interval": self.poll_interval, "faults": list(self.faults),
            "fault_interval": self.fault_interval, "xmin_hold": self.xmin_hold, "seed": self.seed,
            "timeout": self.timeout,
            "pgbouncer": self.pgbouncer, "embedded": self.embedded, "unprotected": self.unprotected,
        }


def _whole(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"invalid {name}: expected a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"invalid {name}: must be from {low} to {high}, got {value}")
    return value


def _seconds(name: str, text: str, *, zero: bool = False) -> float:
    value = parse_duration(name, text)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ConfigError(f"invalid {name}: must be {'0 or more' if zero else 'a positive number of'} seconds, "
                          f"got {text!r}")
    return value


def parse_faults(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return FAULTS
    if names in ([], ["none"]):
        return ()
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ConfigError(f"invalid --faults: unknown fault {unknown[0]!r} (known: {', '.join(FAULTS)}, all, none)")
    return tuple(f for f in FAULTS if f in names)


def plan(args: argparse.Namespace) -> Plan:
    """Validate every option; raise ConfigError (exit 2) on the first bad one."""
    jobs = _whole("--jobs", args.jobs, 1, 10_000_000)
    supervisors = _whole("--supervisors", args.supervisors, 1, 64)
    workers = _whole("--workers", args.workers, 1, 512)
    batch = None if args.batch is None else _whole("--batch", args.batch, 1, 1000)
    threads = _whole("--threads", args.threads, 1, THREADS_MAX)
    async_concurrency = _whole("--async-concurrency", args.async_concurrency, 1, ASYNC_CONCURRENCY_MAX)
    weights, limits = mix_mod.parse_mix(args.mix)
    counts = mix_mod.allocate(jobs, weights)
    sleep_mean = _seconds("--sleep-mean", args.sleep_mean, zero=True)
    sleep_max = _seconds("--sleep-max", args.sleep_max, zero=True)
    if sleep_mean > sleep_max:
        raise ConfigError(f"invalid --sleep-mean: {sleep_mean:g}s is longer than --sleep-max ({sleep_max:g}s)")
    lease = _seconds("--lease", args.lease)
    if lease < 0.5:
        raise ConfigError(f"invalid --lease: must be at least 0.5 seconds, got {args.lease!r}")
    poll_interval = _seconds("--poll-interval", args.poll_interval)
    faults = parse_faults(args.faults)
    fault_interval = _seconds("--fault-interval", args.fault_interval)
    xmin_hold = None if args.xmin_hold is None else _seconds("--xmin-hold", args.xmin_hold)
    timeout = _seconds("--timeout", args.timeout)
    seed = secrets.randbelow(2**31) if args.seed is None else _whole("--seed", args.seed, 0, 2**63 - 1)
    if args.embedded and args.dsn:
        raise ConfigError("give --embedded or --dsn, not both")
    if args.pgbouncer:
        from pgfence.tools.loadtest.pgbouncer import find

        if find() is None:
            raise ConfigError("--pgbouncer: no pgbouncer program found (Debian: apt-get install pgbouncer)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - only whether it imports
        except ImportError:
            raise ConfigError("--plot needs matplotlib: pip install 'pgfence[loadtest]'") from None
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            raise ConfigError(f"invalid --plot: no such directory {folder!r}")
    return Plan(jobs=jobs, supervisors=supervisors, workers=workers, batch=batch, threads=threads,
                async_concurrency=async_concurrency, weights=weights,
                counts=counts, limits={name: lim for name, lim in limits.items() if counts[name] > 0},
                sleep_mean=sleep_mean, sleep_max=sleep_max, lease=lease,
                poll_interval=poll_interval, faults=faults, fault_interval=fault_interval, xmin_hold=xmin_hold,
                seed=seed,
                timeout=timeout, json=args.json, plot=args.plot, progress=args.progress, pgbouncer=args.pgbouncer,
                embedded=args.embedded, dsn=args.dsn, log_dir=args.log_dir, unprotected=args.unprotected)
