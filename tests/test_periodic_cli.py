"""`pgfence periodic`: every schedule with its next tick (in its time zone
and UTC), its last run and its skipped, queued and missed ticks, as a table
or as JSON.

The listing is pure (rows and the database's clock in, data and lines out)
and tested so, with fixed clocks; then the real command runs as a
subprocess on rows written with SQL, as a scheduler would leave them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from zoneinfo import ZoneInfo

import psycopg

from pgtools import env_for, finish, pgfence, scalar
from pgfence.admin import periodic
from pgfence.store.periodic import ScheduleListing

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")
UNREACHABLE = "postgresql://postgres:s3cret@127.0.0.1:1/x"


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def row(name: str, **fields) -> ScheduleListing:
    values = dict(name=name, kind="report", queue=None, cron=None, every_seconds=None, tz="UTC", payload={},
                  overlap="skip", catch_up="latest", declared_at=at("2026-12-01T00:00:00+00:00"),
                  checked_until=at("2026-12-04T10:00:00+00:00"), last_tick=None, last_job_id=None,
                  last_status=None, skipped=0, queued=0, missed=0, now=at("2026-12-04T10:00:10.5+00:00"))
    values.update(fields)
    return ScheduleListing(**values)


# -- the listing, pure -------------------------------------------------------------


def test_next_tick_follows_the_schedule_and_the_database_clock():
    # 10:00:10.5 UTC is 11:00:10.5 in Berlin: the next 03:00 there is
    # tomorrow's, 02:00 UTC.
    assert periodic.next_tick(row("n", cron="0 3 * * *", tz="Europe/Berlin")) == \
        (at("2026-12-05T02:00:00+00:00"), None)
    assert periodic.next_tick(row("e", every_seconds=30.0)) == (at("2026-12-04T10:00:30+00:00"), None)
    # The night the clocks go forward (02:00 CET -> 03:00 CEST, 29 March
    # 2026), 02:30 does not exist: the tick is at 03:00 CEST, 01:00 UTC.
    spring = row("s", cron="30 2 * * *", tz="Europe/Berlin", now=at("2026-03-29T00:30:00+00:00"))
    assert periodic.next_tick(spring) == (at("2026-03-29T01:00:00+00:00"), None)
    assert periodic.next_tick(row("z", cron="0 3 * * *", tz="Mars/Base")) == \
        (None, "unknown time zone 'Mars/Base'")
    assert periodic.next_tick(row("c", cron="61 * * * *")) == \
        (None, "invalid cron expression '61 * * * *': Bad minute")


def test_entries_are_json_ready_with_iso_times():
    [entry] = periodic.entries([row(
        "nightly", cron="0 3 * * *", tz="Europe/Berlin", payload={"size": 3}, queue="reports",
        last_tick=at("2026-12-04T02:00:00+00:00"), last_job_id=41, last_status="failed", skipped=2, missed=1)])
    assert entry == {
        "name": "nightly", "kind": "report", "queue": "reports", "cron": "0 3 * * *", "every": None,
        "tz": "Europe/Berlin", "when": "cron 0 3 * * * Europe/Berlin", "payload": {"size": 3}, "overlap": "skip",
        "catch_up": "latest", "next_tick": "2026-12-05T02:00:00+00:00",
        "next_tick_local": "2026-12-05T03:00:00+01:00", "invalid": None,
        "last_tick": "2026-12-04T02:00:00+00:00", "last_job_id": 41, "last_job_status": "failed",
        "skipped": 2, "queued": 0, "missed": 1, "declared_at": "2026-12-01T00:00:00+00:00",
        "checked_until": "2026-12-04T10:00:00+00:00",
    }
    # Times read in another session time zone come out in UTC all the same.
    [entry] = periodic.entries([row("e", every_seconds=1.5, last_tick=at("2026-12-04T11:00:09+01:00"))])
    assert (entry["when"], entry["next_tick"], entry["next_tick_local"], entry["last_tick"]) == \
        ("every 1.5s", "2026-12-04T10:00:12+00:00", "2026-12-04T10:00:12+00:00", "2026-12-04T10:00:09+00:00")


def test_table_lines_escape_hostile_text():
    data = periodic.entries([
        row("evil\x1b]0;pwned\x07\nfake", kind="k\u202eind", cron="0 3 * * *", tz="Mars/\x1b[2J"),
        row("nightly", cron="0 3 * * *", tz="Europe/Berlin", last_tick=at("2026-12-04T02:00:00+00:00"),
            last_job_id=41, last_status="done", skipped=2, missed=1),
        row("ping", kind="noop", queue="fast", every_seconds=30.0, overlap="queue", catch_up="all",
            last_tick=at("2026-12-04T10:00:00+00:00"), last_job_id=1234567, last_status="running", queued=3),
    ])
    assert periodic.table(data) == [
        "name                        kind        queue  when                          overlap  catch_up  "
        "next tick (local)          next tick (UTC)       last tick (UTC)       last job  status   skipped  queued  "
        "missed",
        "evil\\x1b]0;pwned\\x07\\nfake  k\\u202eind  -      cron 0 3 * * * Mars/\\x1b[2J   skip     latest    "
        "-                          -                     -                            -  -              0       0  "
        "     0",
        "nightly                     report      -      cron 0 3 * * * Europe/Berlin  skip     latest    "
        "2026-12-05 03:00:00+01:00  2026-12-05 02:00:00Z  2026-12-04 02:00:00Z        41  done           2       0  "
        "     1",
        "ping                        noop        fast   every 30s                     queue    all       "
        "2026-12-04 10:00:30+00:00  2026-12-04 10:00:30Z  2026-12-04 10:00:00Z   1234567  running        0       3  "
        "     0",
        # The reason quotes the tz as Python does (repr, which escapes it);
        # the table escapes that text again, backslashes included.
        "schedule evil\\x1b]0;pwned\\x07\\nfake: no next tick: unknown time zone 'Mars/\\\\x1b[2J'",
    ]


def test_table_without_schedules_is_one_line():
    assert periodic.table([]) == [periodic.NO_SCHEDULES]


# -- the command, on a real database -------------------------------------------------


def clock(conn: psycopg.Connection) -> dt.datetime:
    return scalar(conn, "SELECT clock_timestamp()")


def next_berlin_3am(now: dt.datetime) -> dt.datetime:
    """The first 03:00 in Berlin after ``now``, computed by hand (03:00
    exists on every day there, once)."""
    local = now.astimezone(BERLIN)
    tick = local.replace(hour=3, minute=0, second=0, microsecond=0)
    if tick <= local:
        tick = (local + dt.timedelta(days=1)).replace(hour=3, minute=0, second=0, microsecond=0)
    return tick.astimezone(UTC)


def next_every(now: dt.datetime, seconds: int) -> dt.datetime:
    epoch = int(now.timestamp()) // seconds * seconds + seconds
    return dt.datetime.fromtimestamp(epoch, UTC)


def add_schedule(conn: psycopg.Connection, name: str, kind: str, **columns) -> None:
    columns = {"name": name, "kind": kind, **columns}
    names = ", ".join(columns)
    marks = ", ".join(f"%({c})s" for c in columns)
    conn.execute(f"INSERT INTO pgfence.schedules ({names}) VALUES ({marks})", columns)


def schedules(conn: psycopg.Connection) -> dict[str, int]:
    """Six schedules as a scheduler leaves them (written with SQL): their
    last jobs in every state, ticks skipped and queued, missed ticks, a
    schedule that never ticked and one with hostile text; the job ids."""
    jobs = {}
    for name, kind in [("nightly", "report"), ("ping", "noop"), ("mailer", "mail"), ("slow", "noop")]:
        jobs[name] = scalar(conn, "SELECT pgfence.enqueue(%s, %s::jsonb, NULL, 0, NULL, NULL, %s)",
                            (kind, json.dumps({"from": name}), f"pgfence:periodic:{name}:x"))
    finish(conn, jobs["nightly"], "done")
    finish(conn, jobs["mailer"], "failed")
    conn.execute("UPDATE pgfence.jobs SET status = 'running', attempt = 1, started_at = now(), locked_by = 'w', "
                 "lease_until = now() + interval '1 hour' WHERE id = %s", (jobs["ping"],))
    tick = "2026-12-04 02:00:00+00"
    add_schedule(conn, "nightly", "report", cron="0 3 * * *", tz="Europe/Berlin",
                 payload=json.dumps({"size": 3}), last_tick=tick, last_job_id=jobs["nightly"], missed_ticks=2)
    add_schedule(conn, "ping", "noop", queue="fast", every_seconds=30, overlap="queue", catch_up="all",
                 last_tick=tick, last_job_id=jobs["ping"])
    add_schedule(conn, "mailer", "mail", every_seconds=3600, overlap="allow", catch_up="none", last_tick=tick,
                 last_job_id=jobs["mailer"])
    add_schedule(conn, "slow", "noop", every_seconds=3600, last_tick=tick, last_job_id=jobs["slow"])
    # Its last job is gone from history (retention): its id, no status.
    add_schedule(conn, "pruned", "noop", every_seconds=3600, last_tick=tick, last_job_id=jobs["slow"] + 1000)
    add_schedule(conn, "zz\x1b[31mred\r\nfake", "k\u202eind", cron="0 3 * * *", tz="Mars/Base",
                 payload=json.dumps({"note": "\x1b]0;pwned\x07"}))
    for tick, outcome in [("2026-12-04 01:00:30+00", "skipped"), ("2026-12-04 01:01:00+00", "skipped"),
                          ("2026-12-04 01:01:30+00", "queued")]:
        conn.execute("INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome) VALUES ('ping', %s, %s)",
                     (tick, outcome))
    conn.execute("INSERT INTO pgfence.schedule_ticks (schedule, tick, outcome) "
                 "VALUES ('nightly', '2026-12-03 02:00:00+00', 'skipped')")
    return jobs


def expected_ticks(before: dt.datetime, after: dt.datetime) -> dict[str, set[dt.datetime]]:
    """Each schedule's possible next ticks, by the clock read before and
    after the command (one tick, unless a tick fell in between)."""
    return {
        "nightly": {next_berlin_3am(before), next_berlin_3am(after)},
        "ping": {next_every(before, 30), next_every(after, 30)},
        "mailer": {next_every(before, 3600), next_every(after, 3600)},
    }


def test_pgfence_periodic_json_has_exact_fields(dsn, conn):
    jobs = schedules(conn)
    before = clock(conn)
    out = pgfence("periodic", "--json", env=env_for(dsn, PGTZ="Asia/Tokyo"))
    after = clock(conn)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    data = json.loads(out.stdout)
    assert [e["name"] for e in data] == ["mailer", "nightly", "ping", "pruned", "slow", "zz\x1b[31mred\r\nfake"]
    possible = expected_ticks(before, after)
    for entry in data:
        declared, checked = entry.pop("declared_at"), entry.pop("checked_until")
        assert before - dt.timedelta(seconds=60) < at(declared) <= before, entry
        assert at(checked) == at(declared)
        if entry["next_tick"] is not None:
            tick = at(entry["next_tick"])
            assert entry["next_tick"] == tick.astimezone(UTC).isoformat()
            assert at(entry["next_tick_local"]) == tick
    by_name = {e["name"]: e for e in data}
    nightly = at(by_name["nightly"]["next_tick"])
    assert nightly in possible["nightly"]
    assert by_name["nightly"] == {
        "name": "nightly", "kind": "report", "queue": None, "cron": "0 3 * * *", "every": None,
        "tz": "Europe/Berlin", "when": "cron 0 3 * * * Europe/Berlin", "payload": {"size": 3},
        "overlap": "skip", "catch_up": "latest", "next_tick": nightly.isoformat(),
        "next_tick_local": nightly.astimezone(BERLIN).isoformat(), "invalid": None,
        "last_tick": "2026-12-04T02:00:00+00:00", "last_job_id": jobs["nightly"], "last_job_status": "done",
        "skipped": 1, "queued": 0, "missed": 2,
    }
    ping = at(by_name["ping"]["next_tick"])
    assert ping in possible["ping"]
    assert by_name["ping"] == {
        "name": "ping", "kind": "noop", "queue": "fast", "cron": None, "every": 30.0, "tz": "UTC",
        "when": "every 30s", "payload": {}, "overlap": "queue", "catch_up": "all",
        "next_tick": ping.isoformat(), "next_tick_local": ping.isoformat(), "invalid": None,
        "last_tick": "2026-12-04T02:00:00+00:00", "last_job_id": jobs["ping"], "last_job_status": "running",
        "skipped": 2, "queued": 1, "missed": 0,
    }
    hourly = at(by_name["mailer"]["next_tick"])
    assert hourly in possible["mailer"]
    assert (by_name["mailer"]["overlap"], by_name["mailer"]["catch_up"], by_name["mailer"]["last_job_status"]) \
        == ("allow", "none", "failed")
    assert [(by_name[n]["last_job_id"], by_name[n]["last_job_status"], at(by_name[n]["next_tick"]))
            for n in ("pruned", "slow")] == [(jobs["slow"] + 1000, None, hourly), (jobs["slow"], "queued", hourly)]
    assert by_name["zz\x1b[31mred\r\nfake"] == {
        "name": "zz\x1b[31mred\r\nfake", "kind": "k\u202eind", "queue": None, "cron": "0 3 * * *", "every": None,
        "tz": "Mars/Base", "when": "cron 0 3 * * * Mars/Base", "payload": {"note": "\x1b]0;pwned\x07"},
        "overlap": "skip", "catch_up": "latest", "next_tick": None, "next_tick_local": None,
        "invalid": "unknown time zone 'Mars/Base'", "last_tick": None, "last_job_id": None,
        "last_job_status": None, "skipped": 0, "queued": 0, "missed": 0,
    }


def test_pgfence_periodic_table(dsn, conn):
    jobs = schedules(conn)
    before = clock(conn)
    out = pgfence("periodic", env=env_for(dsn, PGTZ="America/New_York"))
    after = clock(conn)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    lines = out.stdout.splitlines()
    assert len(lines) == 8, out.stdout
    # No cell holds two spaces in a row: columns are split at those (the
    # exact layout is tested above).
    rows = [re.split(r" {2,}", line.strip()) for line in lines[:7]]
    assert rows[0] == list(periodic.HEADERS)
    possible = expected_ticks(before, after)

    def ticks(name: str, zone: ZoneInfo) -> list[list[str]]:
        """The next tick's two cells, for each tick the command may have seen."""
        return [[t.astimezone(zone).isoformat().replace("T", " "), t.isoformat().replace("T", " ")[:-6] + "Z"]
                for t in sorted(possible[name])]

    last = "2026-12-04 02:00:00Z"
    expected = [
        [["mailer", "mail", "-", "every 3600s", "allow", "none", *tick, last, str(jobs["mailer"]), "failed",
          "0", "0", "0"] for tick in ticks("mailer", ZoneInfo("UTC"))],
        [["nightly", "report", "-", "cron 0 3 * * * Europe/Berlin", "skip", "latest", *tick, last,
          str(jobs["nightly"]), "done", "1", "0", "2"] for tick in ticks("nightly", BERLIN)],
        [["ping", "noop", "fast", "every 30s", "queue", "all", *tick, last, str(jobs["ping"]), "running",
          "2", "1", "0"] for tick in ticks("ping", ZoneInfo("UTC"))],
        [["pruned", "noop", "-", "every 3600s", "skip", "latest", *tick, last, str(jobs["slow"] + 1000), "-",
          "0", "0", "0"] for tick in ticks("mailer", ZoneInfo("UTC"))],
        [["slow", "noop", "-", "every 3600s", "skip", "latest", *tick, last, str(jobs["slow"]), "queued",
          "0", "0", "0"] for tick in ticks("mailer", ZoneInfo("UTC"))],
        [["zz\\x1b[31mred\\r\\nfake", "k\\u202eind", "-", "cron 0 3 * * * Mars/Base", "skip", "latest", "-", "-",
          "-", "-", "-", "0", "0", "0"]],
    ]
    for got, options in zip(rows[1:], expected, strict=True):
        assert got in options, (got, options)
    assert lines[7] == "schedule zz\\x1b[31mred\\r\\nfake: no next tick: unknown time zone 'Mars/Base'"


def test_pgfence_periodic_without_schedules(dsn):
    out = pgfence("periodic", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, periodic.NO_SCHEDULES + "\n", "")
    out = pgfence("periodic", "--json", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "[]\n", "")


def test_pgfence_periodic_unreachable_or_without_schema(dsn, conn, empty_dsn):
    for args in (["periodic"], ["periodic", "--json"]):
        out = pgfence(*args, "--dsn", UNREACHABLE)
        assert (out.returncode, out.stdout) == (1, "")
        assert out.stderr.startswith("pgfence: error: database unreachable (user=postgres dbname=x host=127.0.0.1 "
                                     "port=1): ") and out.stderr.count("\n") == 1, out.stderr
        assert "s3cret" not in out.stderr
        out = pgfence(*args, dsn=empty_dsn)
        assert (out.returncode, out.stdout, out.stderr) == (
            1, "", "pgfence: error: pgfence schema missing (relation \"pgfence.schedules\" does not exist): "
                   "run 'pgfence migrate'\n")
    # A database migrated by a pgfence from before periodic jobs.
    conn.execute("DROP TABLE pgfence.schedule_ticks, pgfence.schedules")
    out = pgfence("periodic", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (
        1, "", "pgfence: error: pgfence schema missing (relation \"pgfence.schedules\" does not exist): "
               "run 'pgfence migrate'\n")
