"""How a setting's value is read: the converters a declaration names
(:func:`pgfence.settings.setting`), from text (the environment, the command
line) or a TOML value to the setting's value, with one ``ConfigError`` line
naming the setting when the value will not do."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from pgfence.errors import ConfigError
from pgfence.scheduling.schedule import Schedule

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")


_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

#: A converter takes the setting's label (its name with dashes, for the error
#: line) and a value as a source gives it (text from the environment or the
#: command line, a TOML value), and returns the setting's value.
#: A converter takes the setting's label (its name with dashes, for the error
#: line) and a value as a source gives it (text from the environment or the
#: command line, a TOML value), and returns the setting's value.
Converter = Callable[[str, Any], Any]


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def parse_duration(name: str, text: Any) -> float:
    """Seconds from ``12``, ``1.5``, ``250ms``, ``30s``, ``5m``, ``2h`` or ``7d``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"invalid {name}: expected seconds (like 30, 30s, 5m, 7d), got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def duration(label: str, value: Any) -> float:
    """A number of seconds; a value is required."""
    if _is_none(value):
        raise ConfigError(f"invalid {label}: a value is required")
    return parse_duration(label, value)


def whole(label: str, value: Any) -> int:
    """A whole number (``3``, not ``3.0`` nor ``true``)."""
    if _is_none(value):
        raise ConfigError(f"invalid {label}: a value is required")
    try:
        if isinstance(value, float | bool):
            raise ValueError
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"invalid {label}: expected a whole number, got {value!r}") from None


def text(label: str, value: Any) -> str:
    """A string, as given."""
    if _is_none(value):
        raise ConfigError(f"invalid {label}: a value is required")
    return str(value)


def boolean(label: str, value: Any) -> bool:
    """true/false, yes/no, on/off or 1/0."""
    if isinstance(value, bool):
        return value
    if _is_none(value):
        raise ConfigError(f"invalid {label}: a value is required")
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {label}: expected true or false, got {value!r}")


def name_list(label: str, value: Any) -> tuple[str, ...]:
    """Names, comma-separated in text or a TOML list; blanks dropped.  An
    empty TOML list is an empty tuple (the setting's own check decides
    whether that is allowed); empty text or none is a missing value."""
    if _is_none(value):
        raise ConfigError(f"invalid {label}: a value is required")
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


def optional(convert: Converter) -> Converter:
    """``convert``, except that ``none`` (or an empty value) means None."""

    def convert_optional(label: str, value: Any) -> Any:
        return None if _is_none(value) else convert(label, value)

    convert_optional.__doc__ = f"{convert.__doc__} Or none."
    convert_optional.__wrapped__ = convert   # type: ignore[attr-defined]
    return convert_optional


optional_duration = optional(duration)


_SCHEDULE_KEYS = ("name", "kind", "cron", "every", "tz", "payload", "queue", "overlap", "catch_up", "catch_up_window")


def schedules(label: str, value: Any) -> tuple[Schedule, ...]:
    """Schedules: an array of TOML tables (``[[periodic]]``), or the same as
    a JSON array of objects (in the environment), each with ``name``,
    ``kind``, ``cron`` or ``every`` and the options of ``pgfence.periodic``."""
    if _is_none(value):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"invalid {label}: expected a JSON array of schedules: {exc}") from None
    if not isinstance(value, list | tuple):
        raise ConfigError(f"invalid {label}: expected an array of tables ([[periodic]]), got {value!r:.80}")
    out: list[Schedule] = []
    for index, table in enumerate(value):
        where = f"{label} #{index + 1}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"invalid {where}: expected a table, got {table!r:.80}")
        unknown = sorted(set(table) - set(_SCHEDULE_KEYS))
        if unknown:
            raise ConfigError(f"invalid {where}: unknown key {unknown[0]!r} (known: {', '.join(_SCHEDULE_KEYS)})")
        for key in ("name", "kind"):
            if not isinstance(table.get(key), str) or not table.get(key):
                raise ConfigError(f"invalid {where}: {key} is required")
        options = dict(table)
        if options.get("every") is not None:
            options["every"] = parse_duration(f"every of schedule {table['name']!r}", options["every"])
        if options.get("catch_up_window") is not None:
            options["catch_up_window"] = parse_duration(f"catch_up_window of schedule {table['name']!r}",
                                                        options["catch_up_window"])
        for key in ("cron", "tz", "queue", "overlap", "catch_up"):
            if key in options and not isinstance(options[key], str):
                raise ConfigError(f"invalid {where}: {key} must be text, got {options[key]!r:.80}")
        out.append(Schedule(**options))
    seen: set[str] = set()
    for schedule in out:
        if schedule.name in seen:
            raise ConfigError(f"invalid {label}: schedule {schedule.name!r} is declared twice")
        seen.add(schedule.name)
    return tuple(out)
