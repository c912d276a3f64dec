"""``pgfence periodic``: every schedule in the database, with its next tick,
its last run and its skipped, queued and missed ticks.

:func:`entries` turns the stored rows into plain data (what ``--json``
prints); :func:`table` lays that data out for a terminal.  Both are pure, so
their output is tested without a database or a clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import psycopg

from pgfence import errortext
from pgfence.errors import ConfigError
from pgfence.scheduling.schedule import Schedule
from pgfence.store import db
from pgfence.store import periodic as store

#: What the table shows for a value that does not exist (no last tick, no
#: queue of its own, a next tick that cannot be computed).
NONE = "-"
#: The placeholder name and kind of the Schedule that computes a row's next
#: tick.  The tick depends on cron, every and tz alone, while Schedule also
#: checks the name and kind: a row written by hand with a name pgfence
#: would refuse must still show its next tick.
_PLACEHOLDER = "listing"


def listing(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every schedule, by name, as :func:`entries` gives it."""
    with db.translated():
        rows = store.list_schedules(conn)
    return entries(rows)


def next_tick(row: store.ScheduleListing) -> tuple[dt.datetime | None, str | None]:
    """The row's first tick after the database's ``now``, by
    :meth:`Schedule.next_tick`; or None and the reason when its definition
    cannot run (an unknown time zone, a cron expression this version
    refuses)."""
    try:
        schedule = Schedule(_PLACEHOLDER, _PLACEHOLDER, cron=row.cron, every=row.every_seconds, tz=row.tz)
        return schedule.next_tick(row.now), None
    except ConfigError as exc:
        return None, str(exc).removeprefix(f"schedule {_PLACEHOLDER!r}: ")


def when(cron: str | None, every: float | None, tz: str) -> str:
    """``cron 0 3 * * * Europe/Berlin`` or ``every 30s``, as stored (not escaped)."""
    if cron is not None:
        return f"cron {cron} {tz}"
    if every is None:
        return NONE
    return f"every {int(every) if every.is_integer() else every}s"


def _utc(at: dt.datetime | None) -> str | None:
    return at.astimezone(dt.UTC).isoformat() if at is not None else None


def _local(at: dt.datetime | None, tz: str) -> str | None:
    """``at`` in the schedule's time zone (only for a tick computed from it,
    so the zone is known to exist)."""
    if at is None:
        return None
    from zoneinfo import ZoneInfo

    return at.astimezone(ZoneInfo(tz)).isoformat()


def entries(rows: Sequence[store.ScheduleListing]) -> list[dict[str, Any]]:
    """One dict per schedule, every time ISO 8601 (UTC, except the next
    tick's local form in the schedule's tz), text as stored."""
    out = []
    for row in rows:
        tick, problem = next_tick(row)
        out.append({
            "name": row.name, "kind": row.kind, "queue": row.queue, "cron": row.cron,
            "every": row.every_seconds, "tz": row.tz, "when": when(row.cron, row.every_seconds, row.tz),
            "payload": row.payload, "overlap": row.overlap, "catch_up": row.catch_up,
            "next_tick": _utc(tick), "next_tick_local": _local(tick, row.tz), "invalid": problem,
            "last_tick": _utc(row.last_tick), "last_job_id": row.last_job_id, "last_job_status": row.last_status,
            "skipped": row.skipped, "queued": row.queued, "missed": row.missed,
            "declared_at": _utc(row.declared_at), "checked_until": _utc(row.checked_until),
        })
    return out


#: What the table says when there is no schedule.
NO_SCHEDULES = "no schedules (a supervisor records the schedules it declares when it starts)"

HEADERS = ("name", "kind", "queue", "when", "overlap", "catch_up", "next tick (local)", "next tick (UTC)",
           "last tick (UTC)", "last job", "status", "skipped", "queued", "missed")
#: Columns aligned to the right: the numbers.
_RIGHT = {"last job", "skipped", "queued", "missed"}


def _shown_time(iso: str | None) -> str:
    """An ISO time as the table shows it: a space for the ``T``, ``Z`` for UTC."""
    if iso is None:
        return NONE
    text = iso.replace("T", " ", 1)
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


def _cells(entry: dict[str, Any]) -> list[str]:
    # Names, kinds, queues, cron expressions and time zones are whatever the
    # row holds: each is escaped, so no control character reaches the
    # terminal.  The local next tick keeps its offset (+01:00).
    local = entry["next_tick_local"]
    return [
        errortext.one_line(entry["name"]), errortext.one_line(entry["kind"]),
        errortext.one_line(entry["queue"]) if entry["queue"] is not None else NONE,
        errortext.one_line(entry["when"]), errortext.one_line(entry["overlap"]),
        errortext.one_line(entry["catch_up"]),
        local.replace("T", " ", 1) if local is not None else NONE,
        _shown_time(entry["next_tick"]), _shown_time(entry["last_tick"]),
        str(entry["last_job_id"]) if entry["last_job_id"] is not None else NONE,
        errortext.one_line(entry["last_job_status"]) if entry["last_job_status"] is not None else NONE,
        str(entry["skipped"]), str(entry["queued"]), str(entry["missed"]),
    ]


def table(data: Sequence[dict[str, Any]]) -> list[str]:
    """The lines of the table: a header, one line per schedule, each column
    as wide as its widest cell; then a line per schedule whose next tick
    cannot be computed, with the reason."""
    if not data:
        return [NO_SCHEDULES]
    rows = [list(HEADERS)] + [_cells(entry) for entry in data]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = []
    for row in rows:
        cells = [cell.rjust(width) if header in _RIGHT else cell.ljust(width)
                 for cell, width, header in zip(row, widths, HEADERS, strict=True)]
        lines.append("  ".join(cells).rstrip())
    for entry in data:
        if entry["invalid"] is not None:
            lines.append(f"schedule {errortext.one_line(entry['name'])}: no next tick: "
                         f"{errortext.one_line(entry['invalid'])}")
    return lines
