"""A schedule and its ticks.

A tick is an instant (UTC, microseconds, as ``timestamptz`` keeps it).  A
cron schedule's ticks are its expression's times in its time zone, computed
by `cronsim <https://pypi.org/project/cronsim/>`_, which follows Debian's
cron across daylight saving changes:

- a time the clocks skip (02:30 on the day they go forward) runs at the
  first time after the gap (03:00), once;
- a time the clocks pass twice (02:30 on the day they go back) runs once,
  at its first pass, for an expression with a fixed hour; an expression
  that fires every hour (``*`` or a step in the hour field) fires in both
  passes, as the hour really happens twice.

An ``every`` schedule's ticks are the multiples of its interval since the
Unix epoch (UTC): every supervisor computes the same grid, whenever it
started, and time zones do not move it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgfence import names
from pgfence.errors import ConfigError

OVERLAP = ("skip", "allow", "queue")
CATCH_UP = ("latest", "none", "all")

#: The shortest interval of an ``every`` schedule.
EVERY_MIN = 1.0
#: The default bound of ``catch_up = "all"``: ticks older than this when a
#: scheduler comes back are missed.
CATCH_UP_WINDOW = 86400.0
#: The most ticks one round enqueues for one schedule (``catch_up = "all"``
#: after a long stop of an every-second schedule); older ones are missed.
CATCH_UP_MAX = 10_000

_US = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Schedule:
    """One schedule: enqueue a job of ``kind`` with ``payload`` at each tick."""

    name: str
    kind: str
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    payload: Mapping[str, Any] | list[Any] | str | int | float | bool | None = field(default=None)
    queue: str | None = None
    overlap: str = "skip"
    catch_up: str = "latest"
    catch_up_window: float = CATCH_UP_WINDOW

    def __post_init__(self) -> None:
        check(self)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def when(self) -> str:
        """The schedule as text: ``cron 0 3 * * * Europe/Berlin`` or ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron} {self.tz}"
        return f"every {self.every:g}s"

    @property
    def payload_json(self) -> str:
        return json.dumps({} if self.payload is None else self.payload, separators=(",", ":"), sort_keys=True)

    def ticks(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """The ticks in ``(after, until]``, oldest first, as UTC datetimes."""
        if until <= after:
            return
        if self.every is not None:
            step = round(self.every * _US)
            first = (_micros(after) // step + 1) * step
            last = _micros(until)
            for at in range(first, last + 1, step):
                yield _EPOCH + timedelta(microseconds=at)
            return
        from cronsim import CronSim

        assert self.cron is not None
        for fired in CronSim(self.cron, after.astimezone(self.zone)):
            at_utc = fired.astimezone(UTC)
            if at_utc > until:
                return
            if at_utc > after:   # cronsim starts from the minute after
                yield at_utc

    def count(self, after: datetime, until: datetime) -> int:
        """How many ticks fall in ``(after, until]`` (computed, not listed,
        for an ``every`` schedule)."""
        if until <= after:
            return 0
        if self.every is not None:
            step = round(self.every * _US)
            return _micros(until) // step - _micros(after) // step
        return sum(1 for _ in self.ticks(after, until))

    def next_tick(self, after: datetime) -> datetime:
        """The first tick after ``after``."""
        if self.every is not None:
            step = round(self.every * _US)
            return _EPOCH + timedelta(microseconds=(_micros(after) // step + 1) * step)
        # A cron expression may fire once a year (or on 29 February):
        # look up to 8 years ahead.
        for tick in self.ticks(after, after + timedelta(days=8 * 366)):
            return tick
        raise ConfigError(f"schedule {self.name!r}: cron {self.cron!r} never fires")

    def dedupe_key(self, tick: datetime) -> str:
        """The dedupe key of the job of ``tick``: see :func:`tick_key`."""
        return tick_key(self.name, tick)


#: Dedupe keys of periodic jobs start with this; enqueue refuses it from
#: anyone else, so that ``job.scheduled_for`` can trust it.
TICK_KEY_PREFIX = "pgfence:periodic:"


def tick_key(schedule: str, tick: datetime) -> str:
    """``pgfence:periodic:<schedule>:<tick, UTC, ISO 8601>``: the dedupe key
    of a tick's job and the idempotency key of its effects (the same for
    every attempt of it, and for no other tick)."""
    import urllib.parse

    return f"{TICK_KEY_PREFIX}{urllib.parse.quote(schedule, safe='')}:{tick.astimezone(UTC).isoformat()}"


def parse_tick_key(key: str | None) -> tuple[str, datetime] | None:
    """(schedule, tick) of a periodic job's dedupe key; None for any other."""
    import urllib.parse

    if not key or not key.startswith(TICK_KEY_PREFIX):
        return None
    name, sep, at = key[len(TICK_KEY_PREFIX):].partition(":")
    if not sep:
        return None
    try:
        return urllib.parse.unquote(name), datetime.fromisoformat(at)
    except ValueError:
        return None


def _micros(at: datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86400 + delta.seconds) * _US + delta.microseconds


def check(schedule: Schedule) -> None:
    """Refuse a schedule that cannot run, with one line (ConfigError)."""
    label = f"schedule {schedule.name!r}"
    if not isinstance(schedule.name, str) or not schedule.name:
        raise ConfigError("a schedule needs a non-empty name")
    names.check(schedule.name, "schedule")
    names.check(schedule.kind, "kind")
    if schedule.queue is not None:
        names.check(schedule.queue, "queue")
    if (schedule.cron is None) == (schedule.every is None):
        raise ConfigError(f"{label}: give exactly one of cron and every")
    if schedule.every is not None:
        if isinstance(schedule.every, bool) or not isinstance(schedule.every, int | float) \
                or not math.isfinite(schedule.every) or schedule.every < EVERY_MIN:
            raise ConfigError(f"{label}: every must be at least {EVERY_MIN:g} second, got {schedule.every!r}")
        if schedule.every > 366 * 86400:
            raise ConfigError(f"{label}: every must be at most 366 days, got {schedule.every!r}")
    if not isinstance(schedule.tz, str) or not schedule.tz:
        raise ConfigError(f"{label}: tz must name a time zone, got {schedule.tz!r}")
    try:
        ZoneInfo(schedule.tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{label}: unknown time zone {schedule.tz!r}") from None
    if schedule.cron is not None:
        from cronsim import CronSim, CronSimError

        if not isinstance(schedule.cron, str):
            raise ConfigError(f"{label}: cron must be text, got {schedule.cron!r}")
        try:
            CronSim(schedule.cron, datetime.now(UTC))
        except CronSimError as exc:
            raise ConfigError(f"{label}: invalid cron expression {schedule.cron!r}: {exc}") from None
    if schedule.overlap not in OVERLAP:
        raise ConfigError(f"{label}: overlap must be one of {', '.join(OVERLAP)}, got {schedule.overlap!r}")
    if schedule.catch_up not in CATCH_UP:
        raise ConfigError(f"{label}: catch_up must be one of {', '.join(CATCH_UP)}, got {schedule.catch_up!r}")
    window = schedule.catch_up_window
    if isinstance(window, bool) or not isinstance(window, int | float) or not math.isfinite(window) or window <= 0:
        raise ConfigError(f"{label}: catch_up_window must be a positive number of seconds, got {window!r}")
    try:
        json.dumps({} if schedule.payload is None else schedule.payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: payload is not JSON: {exc}") from None
