"""Periodic jobs, pure logic: ticks (cron in a time zone, every N seconds),
daylight saving days, catch-up and overlap decisions, tick keys, settings.
No database: the database's clock is given as plain datetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgfence import registry
from pgfence.errors import ConfigError
from pgfence.scheduling.plan import Action, decide, due
from pgfence.scheduling.schedule import Schedule, parse_tick_key, tick_key
from pgfence.settings import load


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(tz: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)


def rounds(schedule: Schedule, start: datetime, end: datetime, step: float = 60.0, grace: float = 10.0):
    """The ticks a scheduler enqueues when it runs a round every ``step``
    seconds of the database's clock from ``start`` to ``end``, as the
    scheduler does it: each round decides (checked_until, now]."""
    enqueued: list[datetime] = []
    checked, now = start, start
    while now < end:
        now = min(end, now + timedelta(seconds=step))
        got = due(schedule, checked, now, max(grace, step))
        assert got.missed == 0
        enqueued += got.ticks
        checked = now
    return enqueued


# -- every N seconds --------------------------------------------------------------


def test_every_ticks_sit_on_the_epoch_grid_whatever_the_start():
    s = Schedule("e", "k", every=5)
    assert list(s.ticks(utc(2026, 1, 1, 0, 0, 3), utc(2026, 1, 1, 0, 0, 20))) == [
        utc(2026, 1, 1, 0, 0, 5), utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 0, 15), utc(2026, 1, 1, 0, 0, 20)]
    # (after, until]: a tick at `after` was decided by the round before.
    assert list(s.ticks(utc(2026, 1, 1, 0, 0, 5), utc(2026, 1, 1, 0, 0, 9, 999999))) == []
    assert s.count(utc(2026, 1, 1), utc(2026, 1, 2)) == 86400 // 5
    assert s.next_tick(utc(2026, 1, 1, 0, 0, 5)) == utc(2026, 1, 1, 0, 0, 10)
    assert s.next_tick(utc(2026, 1, 1, 0, 0, 4, 999999)) == utc(2026, 1, 1, 0, 0, 5)


def test_every_one_second_rounds_at_any_pace_enqueue_each_tick_once():
    s = Schedule("e", "k", every=1)
    start = utc(2026, 6, 1, 12, 0, 0, 500000)
    for step in (0.3, 1.0, 1.7, 4.9):
        got = rounds(s, start, start + timedelta(seconds=30), step=step)
        assert got == [utc(2026, 6, 1, 12, 0, n) for n in range(1, 31)], step


# -- cron in a time zone across daylight saving changes (2026) --------------------


@pytest.mark.parametrize("tz, day, skipped_to", [
    ("Europe/Berlin", (2026, 3, 29), 3),       # 02:00 -> 03:00 CEST
    ("America/New_York", (2026, 3, 8), 3),     # 02:00 -> 03:00 EDT
])
def test_spring_forward_a_2am_schedule_runs_once_just_after_the_gap(tz, day, skipped_to):
    s = Schedule("nightly", "report", cron="0 2 * * *", tz=tz)
    start = local(tz, *day) - timedelta(days=1)
    got = rounds(s, start.astimezone(UTC), (start + timedelta(days=3)).astimezone(UTC))
    y, m, d = day
    before, the_day, after = (datetime(y, m, d) + timedelta(days=n) for n in (-1, 0, 1))
    assert [t.astimezone(ZoneInfo(tz)) for t in got] == [
        local(tz, before.year, before.month, before.day, 2),
        local(tz, y, m, d, skipped_to),          # the clocks skip 02:00: once, at 03:00
        local(tz, after.year, after.month, after.day, 2),
    ]
    # Exactly the instants, in UTC: the day of the change is 23 hours long.
    assert got[1] - got[0] == timedelta(hours=24) and got[2] - got[1] == timedelta(hours=23)


@pytest.mark.parametrize("tz, day", [
    ("Europe/Berlin", (2026, 10, 25)),         # 03:00 CEST -> 02:00 CET
    ("America/New_York", (2026, 11, 1)),       # 02:00 EDT -> 01:00 EST
])
def test_fall_back_a_fixed_hour_schedule_runs_once_in_the_repeated_hour(tz, day):
    # In Berlin 02:00-03:00 happens twice; in New York 01:00-02:00 does.
    hour = 2 if tz == "Europe/Berlin" else 1
    s = Schedule("nightly", "report", cron=f"30 {hour} * * *", tz=tz)
    start = local(tz, *day) - timedelta(days=1)
    got = rounds(s, start.astimezone(UTC), (start + timedelta(days=3)).astimezone(UTC))
    y, m, d = day
    zone = ZoneInfo(tz)
    assert [t.astimezone(zone).replace(tzinfo=None) for t in got] == [
        datetime(y, m, d, hour, 30) - timedelta(days=1), datetime(y, m, d, hour, 30),
        datetime(y, m, d, hour, 30) + timedelta(days=1)]
    # The one run on the day is the first pass (summer time, fold 0).
    assert got[1] == local(tz, y, m, d, hour, 30, fold=0).astimezone(UTC)
    assert got[1] != local(tz, y, m, d, hour, 30, fold=1).astimezone(UTC)
    assert got[2] - got[1] == timedelta(hours=25)


def test_fall_back_an_hourly_schedule_fires_in_both_passes_of_the_repeated_hour():
    s = Schedule("hourly", "report", cron="0 * * * *", tz="Europe/Berlin")
    got = rounds(s, utc(2026, 10, 24, 21, 30), utc(2026, 10, 25, 2))
    # 00:00, 01:00, 02:00 CEST, 02:00 CET, 03:00 CET: every real hour once.
    assert got == [utc(2026, 10, 24, 22), utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 1),
                   utc(2026, 10, 25, 2)]


def test_cron_ticks_are_the_same_whether_a_round_comes_each_second_or_each_hour():
    s = Schedule("q", "k", cron="*/15 * * * *", tz="America/New_York")
    start, end = utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)
    fine = rounds(s, start, end, step=1.0)
    coarse = rounds(s, start, end, step=3600.0, grace=3600.0)
    assert fine == coarse == [start + timedelta(minutes=15 * n) for n in range(1, 17)]


# -- catch-up after downtime ------------------------------------------------------------


def _downtime(catch_up: str, **options):
    s = Schedule("c", "k", every=4, catch_up=catch_up, **options)
    checked = utc(2026, 6, 1, 12, 0, 1)         # ticks at :04 :08 :12 :16 :20 fall in the gap
    return due(s, checked, utc(2026, 6, 1, 12, 0, 22), grace=10.0)


def test_catch_up_latest_enqueues_only_the_most_recent_missed_tick():
    got = _downtime("latest")
    assert (got.ticks, got.missed) == ([utc(2026, 6, 1, 12, 0, 20)], 4)


def test_catch_up_none_enqueues_nothing_and_counts_every_tick_missed():
    got = _downtime("none")
    assert (got.ticks, got.missed) == ([], 5)


def test_catch_up_all_enqueues_every_missed_tick_within_its_window():
    got = _downtime("all")
    assert (got.ticks, got.missed) == ([utc(2026, 6, 1, 12, 0, s) for s in (4, 8, 12, 16, 20)], 0)
    bounded = _downtime("all", catch_up_window=9)
    assert (bounded.ticks, bounded.missed) == ([utc(2026, 6, 1, 12, 0, 16), utc(2026, 6, 1, 12, 0, 20)], 3)


def test_a_gap_within_grace_is_a_late_round_not_downtime():
    s = Schedule("c", "k", every=1, catch_up="none")
    got = due(s, utc(2026, 6, 1, 12, 0, 0), utc(2026, 6, 1, 12, 0, 9, 500000), grace=10.0)
    assert (got.ticks, got.missed) == ([utc(2026, 6, 1, 12, 0, n) for n in range(1, 10)], 0)


def test_no_tick_in_the_gap_enqueues_nothing_and_misses_nothing():
    s = Schedule("c", "k", cron="0 3 * * *", catch_up="latest")
    got = due(s, utc(2026, 6, 1, 4), utc(2026, 6, 1, 20), grace=10.0)
    assert (got.ticks, got.missed) == ([], 0)


# -- overlap ---------------------------------------------------------------------------


T = [utc(2026, 6, 1, 12, 0, n) for n in range(10)]


def test_overlap_skip_enqueues_only_while_no_run_is_outstanding():
    assert decide("skip", T[1:4], busy=False, queued=[]) == [
        Action("enqueue", T[1]), Action("skip", T[2]), Action("skip", T[3])]
    assert decide("skip", T[1:3], busy=True, queued=[]) == [Action("skip", T[1]), Action("skip", T[2])]


def test_overlap_allow_enqueues_every_tick():
    assert decide("allow", T[1:4], busy=True, queued=[]) == [Action("enqueue", t) for t in T[1:4]]


def test_overlap_queue_keeps_one_run_outstanding_and_the_rest_in_tick_order():
    assert decide("queue", T[3:5], busy=True, queued=[T[1], T[2]]) == [Action("queue", T[3]), Action("queue", T[4])]
    # The run ended: the oldest queued tick goes first, new ticks wait behind it.
    assert decide("queue", T[3:5], busy=False, queued=[T[1], T[2]]) == [
        Action("dequeue", T[1]), Action("queue", T[3]), Action("queue", T[4])]
    assert decide("queue", T[3:5], busy=False, queued=[]) == [Action("enqueue", T[3]), Action("queue", T[4])]
    assert decide("queue", [], busy=False, queued=[T[1]]) == [Action("dequeue", T[1])]


# -- keys ------------------------------------------------------------------------------


def test_tick_keys_name_the_schedule_and_the_instant_and_parse_back():
    tick = utc(2026, 3, 29, 1, 0)
    key = tick_key("nightly", tick)
    assert key == "pgfence:periodic:nightly:2026-03-29T01:00:00+00:00"
    assert parse_tick_key(key) == ("nightly", tick)
    # The same instant written in another zone gives the same key.
    assert tick_key("nightly", tick.astimezone(ZoneInfo("Europe/Berlin"))) == key
    hostile = "a:b%c\n"
    assert parse_tick_key(tick_key(hostile, tick)) == (hostile, tick)
    assert parse_tick_key("pgfence:dedupe:x") is None and parse_tick_key(None) is None
    assert parse_tick_key("pgfence:periodic:x:not-a-time") is None


# -- declaring ---------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"cron": "61 * * * *"}, "schedule 'bad': invalid cron expression '61 * * * *': Bad minute"),
    ({"cron": "0 3 * *"}, "schedule 'bad': invalid cron expression '0 3 * *': Wrong number of fields"),
    ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "schedule 'bad': unknown time zone 'Mars/Olympus'"),
    ({"every": 0.5}, "schedule 'bad': every must be at least 1 second, got 0.5"),
    ({}, "schedule 'bad': give exactly one of cron and every"),
    ({"cron": "* * * * *", "every": 5}, "schedule 'bad': give exactly one of cron and every"),
    ({"every": 5, "overlap": "sometimes"}, "schedule 'bad': overlap must be one of skip, allow, queue, got 'sometimes'"),
    ({"every": 5, "catch_up": "most"}, "schedule 'bad': catch_up must be one of latest, none, all, got 'most'"),
    ({"every": 5, "payload": {"x": object()}}, "schedule 'bad': payload is not JSON"),
])
def test_an_invalid_schedule_is_refused_with_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        registry.periodic("bad", "report", **options)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    assert registry.schedules() == []


def test_handler_with_cron_declares_a_schedule_named_after_its_kind():
    @registry.handler("nightly_report", cron="0 3 * * *", tz="Europe/Berlin", payload={"size": 3})
    def nightly(job):
        return None

    assert registry.schedules() == [Schedule("nightly_report", "nightly_report", cron="0 3 * * *",
                                             tz="Europe/Berlin", payload={"size": 3})]
    registry.forget_schedules()
    assert registry.schedules() == []


def test_settings_file_schedules_are_read_and_checked(tmp_path):
    path = tmp_path / "pgfence.toml"
    path.write_text('[[periodic]]\nname = "nightly"\nkind = "report"\ncron = "0 3 * * *"\ntz = "Europe/Berlin"\n'
                    'payload = {size = 3}\n\n[[periodic]]\nname = "fast"\nkind = "noop"\nevery = "2s"\n'
                    'overlap = "queue"\ncatch_up = "all"\ncatch_up_window = "1h"\n')
    assert load({}, {}, str(path)).periodic == (
        Schedule("nightly", "report", cron="0 3 * * *", tz="Europe/Berlin", payload={"size": 3}),
        Schedule("fast", "noop", every=2.0, overlap="queue", catch_up="all", catch_up_window=3600.0))


@pytest.mark.parametrize("body, message", [
    ('[[periodic]]\nname = "x"\nkind = "k"\nevery = 5\ncolour = "red"\n',
     "invalid periodic #1: unknown key 'colour'"),
    ('[[periodic]]\nkind = "k"\nevery = 5\n', "invalid periodic #1: name is required"),
    ('[[periodic]]\nname = "x"\nkind = "k"\nevery = "soon"\n', "invalid every of schedule 'x'"),
    ('[[periodic]]\nname = "x"\nkind = "k"\nevery = 5\n[[periodic]]\nname = "x"\nkind = "k"\nevery = 6\n',
     "invalid periodic: schedule 'x' is declared twice"),
    ('periodic = "x"\n', "invalid periodic: expected a JSON array of schedules"),
])
def test_an_invalid_settings_file_schedule_is_refused_with_one_line(tmp_path, body, message):
    path = tmp_path / "pgfence.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load({}, {}, str(path))
    assert str(err.value).startswith(message)


def test_schedules_in_the_environment_are_json():
    settings = load({}, {"PGFENCE_PERIODIC": '[{"name": "e", "kind": "k", "every": 60}]'})
    assert settings.periodic == (Schedule("e", "k", every=60.0),)
