"""Settings: documented defaults, validated at construction.

Sources, later ones winning: the defaults below, an optional TOML file
(``--config`` or ``PGFENCE_CONFIG``), environment variables ``PGFENCE_<NAME>``
and the command line.  An invalid value raises :class:`ConfigError` with one
line naming the setting.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgfence import bounds
from pgfence import names
from pgfence.errors import ConfigError
from pgfence.registry import DEFAULT_MODULES

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


#: Bounds of idle_in_transaction_timeout, in seconds.
IDLE_IN_TRANSACTION_MIN = 1.0
IDLE_IN_TRANSACTION_MAX = 86400.0


def idle_in_transaction_ms(seconds: float | None) -> str:
    """Seconds (None: off) as the milliseconds PostgreSQL's
    idle_in_transaction_session_timeout takes, '0' meaning off."""
    return "0" if seconds is None else str(max(1, int(seconds * 1000)))


@dataclass(frozen=True)
class Settings:
    #: Queues this worker claims from.
    queues: tuple[str, ...] = ("default",)
    #: Lease length in seconds (a handler's ``lease`` option wins for its kind).
    lease: float = 30.0
    #: Renewal interval in seconds; None means a third of the lease.
    heartbeat: float | None = None
    #: Jobs claimed per claim statement.
    batch: int = 1
    #: Seconds between polls when no NOTIFY arrives.
    poll_interval: float = 5.0
    #: Default handler timeout in seconds (None: no timeout).
    timeout: float | None = None
    #: Retry backoff: base * 2**(attempt-1) seconds, capped, with jitter.
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    #: A worker that claims a job of a kind it does not know (a rolling
    #: deploy: a worker that knows it may not be up yet) puts it back, to be
    #: claimed again no sooner than this many seconds later; no attempt is
    #: spent.
    unknown_kind_delay: float = 30.0
    #: Seconds from a job's creation after which a worker that does not know
    #: its kind fails it (unknown job kind) instead of putting it back.
    unknown_kind_timeout: float = 3600.0
    #: Finished jobs older than this many seconds are deleted (None: kept).
    retention: float | None = 7 * 86400.0
    #: Seconds between retention runs inside the worker system.
    prune_interval: float = 60.0
    #: Handler modules to import, by dotted path.
    handlers: tuple[str, ...] = DEFAULT_MODULES
    #: Worker processes under ``pgfence run``.
    workers: int = 2
    #: Seconds a SIGTERM drain waits for running jobs.
    graceful_timeout: float = 30.0
    #: Seconds a child may keep running a job whose lease is lost.
    lost_lease_kill_after: float = 5.0
    #: Seconds a worker's or the heartbeat's connection may sit idle inside
    #: a transaction (a handler's fenced() block waiting on Python, a host
    #: frozen or cut off mid-transaction) before the server ends its session
    #: and frees the rows it locked; 1s to 1 day, or none to keep the
    #: server's setting.  A handler must not leave its fenced() transaction
    #: idle this long.
    idle_in_transaction_timeout: float | None = 60.0
    #: Where ``pgfence run`` serves /metrics, /healthz and /readyz (port 0: nowhere).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    #: Prometheus multiprocess files (default: $RUNTIME_DIRECTORY/metrics or a temp dir).
    metrics_dir: str | None = None
    #: Wake idle workers with LISTEN/NOTIFY; off behind a transaction-pooling
    #: PgBouncer, where workers poll every poll_interval instead.
    listen: bool = True
    #: Prepare the worker's and the heartbeat's statements on the server
    #: (they run thousands of times); off behind a transaction-pooling
    #: PgBouncer, which cannot keep a prepared statement on one server
    #: connection (before 1.21, or without max_prepared_statements).
    prepare: bool = True
    #: Renew leases and fence completions.  Only ``pgfence demo`` turns
    #: these off, to show what goes wrong without them.
    renew: bool = field(default=True, metadata={"hidden": True})
    fence: bool = field(default=True, metadata={"hidden": True})

    def __post_init__(self) -> None:
        # Every duration within its documented range (supervisor.bounds).
        for name in bounds.RANGES:
            value = getattr(self, name)
            if value is not None or name not in ("heartbeat", "timeout", "retention"):
                bounds.check(name, value)
        idle = self.idle_in_transaction_timeout
        if idle is not None and not (isinstance(idle, int | float) and IDLE_IN_TRANSACTION_MIN <= idle
                                     <= IDLE_IN_TRANSACTION_MAX):
            raise ConfigError(f"invalid idle-in-transaction-timeout: must be {IDLE_IN_TRANSACTION_MIN:g}s to "
                              f"{IDLE_IN_TRANSACTION_MAX:g}s, or none, got {idle!r}")
        for name in ("batch", "workers"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"invalid {name}: must be a whole number of at least 1, got {value!r}")
        if self.heartbeat is not None and self.heartbeat >= self.lease:
            raise ConfigError(f"invalid heartbeat: {self.heartbeat}s must be shorter than the lease ({self.lease}s)")
        if not (isinstance(self.metrics_port, int) and 0 <= self.metrics_port <= 65535):
            raise ConfigError(f"invalid metrics-port: must be 0 to 65535, got {self.metrics_port!r}")
        if not self.metrics_host:
            raise ConfigError("invalid metrics-host: give a host name or address")
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

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def parse_duration(name: str, text: Any) -> float:
    """Seconds from ``12``, ``1.5``, ``250ms``, ``30s``, ``5m``, ``2h`` or ``7d``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"invalid {name}: expected seconds (like 30, 30s, 5m, 7d), got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _convert(name: str, kind: Any, value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        if "None" in str(kind):
            return None
        raise ConfigError(f"invalid {name}: a value is required")
    text = str(kind)
    if text.startswith("str"):
        return str(value)
    if "tuple" in text:
        if isinstance(value, list | tuple):
            return tuple(str(v).strip() for v in value if str(v).strip())
        return tuple(v.strip() for v in str(value).split(",") if v.strip())
    if "bool" in text:
        if isinstance(value, bool):
            return value
        lowered = str(value).strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"invalid {name}: expected true or false, got {value!r}")
    if "int" in text and "float" not in text:
        try:
            if isinstance(value, float) or isinstance(value, bool):
                raise ValueError
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"invalid {name}: expected a whole number, got {value!r}") from None
    return parse_duration(name, value)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def from_mapping(values: Mapping[str, Any], source: str, base: Settings | None = None) -> Settings:
    """A Settings with ``values`` (names with - or _) converted and applied."""
    changes = {}
    for raw_name, value in values.items():
        name = raw_name.replace("-", "_")
        if name not in _FIELDS:
            raise ConfigError(f"unknown setting {raw_name!r} in {source}")
        changes[name] = _convert(name.replace("_", "-"), _FIELDS[name].type, value)
    return dataclasses.replace(base or Settings(), **changes)


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, f in _FIELDS.items():
        if f.metadata.get("hidden"):
            continue
        key = "PGFENCE_" + name.upper()
        if key in env:
            out[name] = env[key]
    return out


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
    """Defaults < TOML file < environment < command line."""
    env = os.environ if env is None else env
    settings = Settings()
    path = config_path or env.get("PGFENCE_CONFIG")
    if path:
        settings = from_mapping(from_toml(path), path, settings)
    settings = from_mapping(from_env(env), "the environment", settings)
    given = {k: v for k, v in cli.items() if v is not None}
    return from_mapping(given, "the command line", settings)
