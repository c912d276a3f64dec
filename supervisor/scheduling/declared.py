"""The schedules a supervisor declares: those of its handler modules (code)
and those of its settings file, checked together."""

from __future__ import annotations

import logging

from pgfence import registry
from pgfence.errors import ConfigError
from pgfence.scheduling.schedule import Schedule
from pgfence.settings import Settings

log = logging.getLogger("pgfence.periodic")


def declared(settings: Settings) -> list[Schedule]:
    """Every schedule declared in code and in ``settings``, by name.  A name
    declared in both is refused (ConfigError): which one would run is not
    something to guess."""
    found = {s.name: s for s in registry.schedules()}
    for schedule in settings.periodic:
        if schedule.name in found:
            raise ConfigError(f"schedule {schedule.name!r} is declared both in code and in the settings file")
        found[schedule.name] = schedule
    return [found[name] for name in sorted(found)]


def warn_unserved(schedules: list[Schedule]) -> None:
    """A schedule whose kind no handler here knows still ticks (another
    deployment may run that kind); say so once at start."""
    for schedule in schedules:
        if registry.find(schedule.kind) is None:
            log.warning("schedule %r enqueues jobs of kind %r, which no handler module of this supervisor "
                        "defines: workers that know it must run them", schedule.name, schedule.kind)
