"""Settings: each declared once, with documented defaults, validated at
construction.

Every setting is one field of :class:`Settings`, declared with
:func:`setting` (``pgfence.settings_declare``): its default, its converter
(``pgfence.settings_values``), its help, the commands that take it.  The
command-line options (``pgfence.cli.parser``), the environment variables
``PGFENCE_<NAME>``, the TOML keys and the docs' settings table (``python
-m pgfence.settings_table``) all follow from that one declaration.

Sources, later ones winning: the defaults below, an optional TOML file
(``--config`` or ``PGFENCE_CONFIG``), environment variables and the command
line.  An invalid value raises :class:`ConfigError` with one line naming the
setting.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pgfence import bounds, names
from pgfence.errors import ConfigError
from pgfence.scheduling.schedule import Schedule
from pgfence.settings_declare import WORKER_COMMANDS, Declaration, declare, setting
from pgfence.settings_values import (
    Converter,
    boolean,
    duration,
    name_list,
    optional,
    optional_duration,
    parse_duration,
    schedules,
    text,
    whole,
)

# The names this module has always offered (the declaration and the
# converters live beside it).
__all__ = [
    "ASYNC_CONCURRENCY_MAX", "DECLARATIONS", "IDLE_IN_TRANSACTION_MAX", "IDLE_IN_TRANSACTION_MIN",
    "SELF_VACUUM_DEAD_TUPLES", "THREADS_MAX", "VACUUM_WARN_DEAD_TUPLES", "VACUUM_WARN_HORIZON", "WORKER_COMMANDS",
    "Converter", "Declaration", "Settings", "boolean", "duration", "for_command", "from_env", "from_mapping",
    "from_toml", "idle_in_transaction_ms", "load", "name_list", "optional", "optional_duration", "parse_duration",
    "schedules", "setting", "text", "whole",
]


#: Bounds of idle_in_transaction_timeout, in seconds.
IDLE_IN_TRANSACTION_MIN = 1.0
IDLE_IN_TRANSACTION_MAX = 86400.0


def idle_in_transaction_ms(seconds: float | None) -> str:
    """Seconds (None: off) as the milliseconds PostgreSQL's
    idle_in_transaction_session_timeout takes, '0' meaning off."""
    return "0" if seconds is None else str(max(1, int(seconds * 1000)))


#: Defaults of the vacuum settings: measured in bench/vacuum_steady.py (see
#: bench/README.md, "Vacuum").
VACUUM_WARN_DEAD_TUPLES = 1_000_000
VACUUM_WARN_HORIZON = 300.0
SELF_VACUUM_DEAD_TUPLES = 100_000

#: Upper bounds of a worker's concurrency: a typo (an extra zero) is refused
#: at start instead of opening thousands of threads.
THREADS_MAX = 1000
ASYNC_CONCURRENCY_MAX = 10_000


@dataclass(frozen=True)
class Settings:
    queues: tuple[str, ...] = setting(
        ("default",), name_list, "comma-separated queues to claim from")
    lease: float = setting(
        30.0, duration, "lease length (a handler's lease option wins for its kind)")
    heartbeat: float | None = setting(
        None, optional_duration, "renewal interval",
        doc="renewal interval; unset, each lease (a kind's own `lease` included) is renewed once a third of "
            "it has passed; set, it must be shorter than the lease and at most half of every handler's "
            "`lease` (else `run`/`work` refuse to start)",
        shown="a third of each lease")
    batch: int | None = setting(
        None, optional(whole), "most jobs claimed per claim statement",
        doc="most jobs claimed per claim statement. Unset, a worker claims as many as it has free slots "
            "(`threads`, plus `async_concurrency` when async handlers are loaded), so no claimed job waits in "
            "one worker's hand while another could run it; set above that for a worker that runs one job at "
            "a time, its claims take that many and run them in turn, completing those that wrote nothing in "
            "one statement (for very short jobs)",
        shown="the worker's free slots")
    threads: int = setting(
        1, whole, "jobs of ordinary (def) handlers each worker runs at once, one thread each",
        doc="jobs of ordinary (`def`) handlers each worker runs at once, one thread each; every job in flight "
            "has its own lease and, when it writes, its own connection from the worker's pool (at most this "
            "many). See \"Run workers\"")
    async_concurrency: int = setting(
        100, whole, "jobs of async def handlers each worker runs at once on its event loop",
        doc="jobs of `async def` handlers each worker runs at once on its one event loop (started only when a "
            "handler module defines an async handler); their `fenced()` blocks share at most "
            "10 connections per worker. See \"Run workers\"")
    poll_interval: float = setting(
        5.0, duration, "longest idle sleep without a NOTIFY",
        doc="longest idle sleep; an enqueue wakes idle workers at once through NOTIFY, and a worker wakes by "
            "itself when the next delayed job or retry of its queues is due, and when the earliest lease of "
            "its queues' running jobs runs out (so the job of a dead worker is reclaimed within about a "
            "second of its lease's end)")
    timeout: float | None = setting(
        None, optional_duration, "default handler timeout",
        doc="default handler timeout, a hard limit: see \"Write handlers\" (a handler's `timeout` and "
            "`lease` options take the same ranges)")
    backoff_base: float = setting(
        1.0, duration, "retry backoff: base * 2**(attempt-1) seconds, with jitter",
        doc="retry backoff: `backoff_base` * 2**(attempt-1), with jitter, capped at `backoff_max`")
    backoff_max: float = setting(300.0, duration, "the longest retry backoff")
    # A worker that claims a job of a kind it does not know (a rolling deploy:
    # a worker that knows it may not be up yet) puts it back; no attempt is
    # spent.
    unknown_kind_delay: float = setting(
        30.0, duration, "how long a job of a kind this worker does not know, put back, waits",
        doc="a job of a kind the worker does not know is put back, to run no sooner than this later (no "
            "attempt spent)")
    unknown_kind_timeout: float = setting(
        3600.0, duration, "age at which a job of a kind this worker does not know fails instead",
        doc="age, from its creation, at which a job of a kind the worker does not know fails (unknown job "
            "kind) instead of being put back")
    retention: float | None = setting(
        7 * 86400.0, optional_duration, "delete finished jobs older than this",
        doc="finished jobs older than this are deleted by the worker every `prune_interval` (`pgfence prune "
            "--retention` too): a day of history (UTC) is dropped whole once it ended this long ago, so a job is "
            "kept between the retention and a day more; none keeps them")
    prune_interval: float = setting(60.0, duration, "time between two rounds of history maintenance: the day "
                                    "partitions of the next days created, old ones dropped")
    handlers: tuple[str, ...] = setting(
        (), name_list, "comma-separated handler modules to import; run and work need one",
        doc="handler modules, imported with the current directory first on `sys.path`; `run` and `work` "
            "need at least one. `pgfence enqueue` reads it too, to check the kind and apply its options",
        commands=("work", "run", "enqueue"))
    workers: int = setting(2, whole, "worker processes", commands=("run",))
    graceful_timeout: float = setting(
        30.0, duration, "how long a SIGTERM drain waits for running jobs", commands=("run",))
    # A child that grows (a leak in a handler or a library, a heap that
    # fragments) is replaced by a fresh one between jobs; off by default.
    max_jobs_per_child: int | None = setting(
        None, optional(whole), "a worker child that has run this many jobs (plus up to a tenth more, drawn per "
                               "child) is replaced by a fresh one",
        doc="a worker child that has run this many jobs (each child draws its own limit in N to N + N/10, so "
            "that children are not replaced all at once) stops claiming, finishes what it holds and exits; the "
            "arbiter starts a fresh child in its place. Not a crash: logged at INFO, no restart counted; none: "
            "never",
        commands=("run",))
    max_memory_per_child: int | None = setting(
        None, optional(whole), "a worker child whose resident memory exceeds this many MiB after a job is "
                               "replaced by a fresh one",
        doc="a worker child whose resident memory (RSS, from /proc/self/statm) exceeds this many MiB, checked "
            "after each claim that ran a job, stops claiming and exits as with `max_jobs_per_child`; none: never",
        commands=("run",))
    lost_lease_kill_after: float = setting(
        5.0, duration, "how long a worker may keep running a job whose lease is lost before it is killed",
        commands=("run",))
    # A handler must not leave its fenced() transaction idle this long: the
    # server would end its session.
    idle_in_transaction_timeout: float | None = setting(
        60.0, optional_duration, "the server ends a session idle in a transaction this long",
        doc="the server ends a worker's or the heartbeat's session left idle inside a transaction this "
            "long (a worker frozen or cut off in a `fenced()` block or before its COMMIT), freeing the rows "
            "it locked; see \"Write handlers\"; 1s to 1d, or none (the server's setting)")
    metrics_host: str = setting(
        "127.0.0.1", text, "address of /metrics, /healthz and /readyz", commands=("run",))
    metrics_port: int = setting(9464, whole, "port of /metrics, /healthz and /readyz; 0: none", commands=("run",))
    metrics_dir: str | None = setting(
        None, optional(text), "a new or empty directory for the processes' metric files",
        doc="a new or empty directory for the processes' Prometheus metric files (pgfence's own: its "
            "files there are deleted at start)",
        shown="$RUNTIME_DIRECTORY/metrics, else a temporary directory", commands=("run",))
    # Vacuum of the jobs table: when to say that it falls behind, and when
    # pgfence runs its own VACUUM (see docs/explanation/vacuum.md).
    vacuum_warn_dead_tuples: int | None = setting(
        VACUUM_WARN_DEAD_TUPLES, optional(whole), "log a warning when pgfence.jobs holds this many dead row versions",
        doc="the metrics server logs a WARNING when pgfence.jobs has held this many dead row versions for 2 "
            "minutes (once, until they fall under half of it); none: never",
        commands=("run",))
    vacuum_warn_horizon: float | None = setting(
        VACUUM_WARN_HORIZON, optional_duration, "log a warning when a transaction holds the xmin horizon this long",
        doc="the metrics server logs a WARNING when a transaction, a prepared transaction or a replication slot "
            "has held the xmin horizon this long (VACUUM can remove no row version it may see), once per holder; "
            "none: never",
        commands=("run",))
    self_vacuum_dead_tuples: int | None = setting(
        SELF_VACUUM_DEAD_TUPLES, optional(whole),
        "the heartbeat manager runs VACUUM on pgfence.jobs when it holds this many dead row versions; none: never",
        doc="the heartbeat manager runs a plain `VACUUM` of pgfence.jobs when it holds this many dead row versions "
            "(autovacuum off, or lagging), at most every 15 s; needs the table's owner, the database's owner or "
            "(PostgreSQL 17) the MAINTAIN privilege, else it warns once and does nothing; none: never",
        commands=("run",))
    # Periodic jobs (see docs/how-to/periodic.md).
    periodic: tuple[Schedule, ...] = setting(
        (), schedules, "schedules of periodic jobs, as [[periodic]] tables in the settings file",
        doc="schedules of periodic jobs besides those declared in code: `[[periodic]]` tables in the settings "
            "file (or a JSON array in `PGFENCE_PERIODIC`), each with `name`, `kind`, `cron` (with `tz`) or "
            "`every`, and optionally `payload`, `queue`, `overlap`, `catch_up`, `catch_up_window`; see "
            "\"Periodic jobs\"",
        shown="none", commands=())
    periodic_grace: float = setting(
        10.0, duration, "a scheduler that finds ticks undecided for longer than this catches them up as missed",
        doc="a scheduler round that finds a schedule's ticks undecided for longer than this (no supervisor ran) "
            "treats them as missed, and enqueues what the schedule's `catch_up` says; within it, every tick is "
            "enqueued (a late round is not downtime)",
        commands=("run",))
    # Off behind a transaction-pooling PgBouncer, where workers poll every
    # poll_interval instead.
    listen: bool = setting(
        True, boolean, "wake idle workers with LISTEN/NOTIFY (--no-listen: poll, for PgBouncer in "
                       "transaction pooling)",
        doc="idle workers wait on `LISTEN pgfence_jobs`; `--no-listen` polls every `poll_interval` instead "
            "(PgBouncer in transaction pooling)")
    # The worker's and the heartbeat's statements run thousands of times.  A
    # transaction-pooling PgBouncer cannot keep a prepared statement on one
    # server connection (before 1.21, or without max_prepared_statements).
    prepare: bool = setting(
        True, boolean, "prepare statements on the server (--no-prepare: for PgBouncer in transaction "
                       "pooling)",
        doc="the worker's and the heartbeat's statements are prepared on the server; `--no-prepare` for "
            "PgBouncer in transaction pooling")
    # The dashboard (`pgfence web`; see docs/how-to/dashboard.md).  Its
    # password is read from PGFENCE_WEB_PASSWORD alone: a secret has no flag
    # (ps shows every process's arguments) and no TOML key.
    web_host: str = setting(
        "127.0.0.1", text, "address the dashboard listens on (any but loopback needs PGFENCE_WEB_PASSWORD)",
        doc="address `pgfence web` listens on; any address but loopback needs a password in "
            "`PGFENCE_WEB_PASSWORD` (else it refuses to start)",
        commands=("web",), option="--host")
    web_port: int = setting(8465, whole, "port the dashboard listens on", commands=("web",), option="--port")
    web_read_only: bool = setting(
        False, boolean, "show everything, allow no action",
        doc="the dashboard shows everything and allows no action (no button rendered, every POST refused)",
        commands=("web",), option="--read-only")
    web_redact_payloads: bool = setting(
        False, boolean, "never show job payloads",
        doc="the dashboard shows `redacted` in place of every job's payload", commands=("web",),
        option="--redact-payloads")
    # Renew leases and fence completions.  Only `--unprotected` (the demo)
    # turns these off, to show what goes wrong without them.
    renew: bool = setting(True, boolean, "renew leases", hidden=True)
    fence: bool = setting(True, boolean, "fence completions", hidden=True)

    def __post_init__(self) -> None:
        # Every duration within its documented range (pgfence.bounds).
        for name in bounds.RANGES:
            value = getattr(self, name)
            if value is not None or name not in ("heartbeat", "timeout", "retention", "vacuum_warn_horizon"):
                bounds.check(name, value)
        idle = self.idle_in_transaction_timeout
        if idle is not None and not (isinstance(idle, int | float) and IDLE_IN_TRANSACTION_MIN <= idle
                                     <= IDLE_IN_TRANSACTION_MAX):
            raise ConfigError(f"invalid idle-in-transaction-timeout: must be {IDLE_IN_TRANSACTION_MIN:g}s to "
                              f"{IDLE_IN_TRANSACTION_MAX:g}s, or none, got {idle!r}")
        for name in ("batch", "workers", "threads", "async_concurrency"):
            value = getattr(self, name)
            if name == "batch" and value is None:
                continue
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"invalid {name}: must be a whole number of at least 1, got {value!r}")
        for name, most in (("threads", THREADS_MAX), ("async_concurrency", ASYNC_CONCURRENCY_MAX)):
            if getattr(self, name) > most:
                raise ConfigError(f"invalid {name.replace('_', '-')}: at most {most} per worker, got "
                                  f"{getattr(self, name)}")
        for name in ("max_jobs_per_child", "max_memory_per_child", "vacuum_warn_dead_tuples",
                     "self_vacuum_dead_tuples"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"invalid {name.replace('_', '-')}: must be a whole number of at least 1, or "
                                  f"none, got {value!r}")
        if self.heartbeat is not None and self.heartbeat >= self.lease:
            raise ConfigError(f"invalid heartbeat: {self.heartbeat}s must be shorter than the lease ({self.lease}s)")
        if not (isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535):
            raise ConfigError(f"invalid metrics-port: must be 0 to 65535, got {self.metrics_port!r}")
        if not self.metrics_host:
            raise ConfigError("invalid metrics-host: give a host name or address")
        if not (isinstance(self.web_port, int) and 1 <= self.web_port <= 65535):
            raise ConfigError(f"invalid port: must be 1 to 65535, got {self.web_port!r}")
        if not self.web_host:
            raise ConfigError("invalid host: give a host name or address")
        if not self.queues or any(not q for q in self.queues):
            raise ConfigError("invalid queues: give one or more non-empty queue names")
        for queue in self.queues:
            found = names.problem(queue, "queue")
            if found:
                raise ConfigError(f"invalid queues: {found}")

    @property
    def idle_in_transaction_ms(self) -> str:
        """``idle_in_transaction_timeout`` as PostgreSQL takes it ('0': off)."""
        return idle_in_transaction_ms(self.idle_in_transaction_timeout)

    def capacity(self, with_async: bool) -> int:
        """Jobs one worker runs at once: its threads, plus its event loop's
        ``async_concurrency`` when async handlers are loaded."""
        return self.threads + (self.async_concurrency if with_async else 0)

    def claim_size(self, with_async: bool) -> int:
        """The most jobs one claim statement takes: ``batch`` if set, else
        the worker's capacity."""
        return self.batch if self.batch is not None else self.capacity(with_async)

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


#: Every setting, in declaration order, by name.
DECLARATIONS: dict[str, Declaration] = {f.name: declare(f) for f in dataclasses.fields(Settings)}


def for_command(command: str) -> list[Declaration]:
    """The settings that ``pgfence COMMAND`` takes as flags."""
    return [d for d in DECLARATIONS.values() if command in d.commands and not d.hidden]


# -- sources ------------------------------------------------------------------------


def from_mapping(values: Mapping[str, Any], source: str, base: Settings | None = None) -> Settings:
    """A Settings with ``values`` (names with - or _) converted and applied."""
    changes = {}
    for raw_name, value in values.items():
        name = raw_name.replace("-", "_")
        declared = DECLARATIONS.get(name)
        if declared is None or declared.hidden:
            raise ConfigError(f"unknown setting {raw_name!r} in {source}")
        changes[name] = declared.convert(declared.label, value)
    return dataclasses.replace(base or Settings(), **changes)


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The ``PGFENCE_<NAME>`` variables of ``env`` that name a setting."""
    return {d.name: env[d.env] for d in DECLARATIONS.values() if not d.hidden and d.env in env}


def from_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"invalid config file {path}: {exc}") from None
    # Settings may sit at the top level or under [pgfence].
    return dict(data.get("pgfence", data))


def load(cli: Mapping[str, Any], env: Mapping[str, str] | None = None,
         config_path: str | None = None) -> Settings:
    """Defaults < TOML file < environment < command line (``cli``: the
    values given, None for the flags left out)."""
    env = os.environ if env is None else env
    settings = Settings()
    path = config_path or env.get("PGFENCE_CONFIG")
    if path:
        settings = from_mapping(from_toml(path), path, settings)
    settings = from_mapping(from_env(env), "the environment", settings)
    given = {k: v for k, v in cli.items() if v is not None}
    return from_mapping(given, "the command line", settings)
