"""`pgfence limits`: show every kind's concurrency limits and their use, set
a kind's at run time, reset it to its handler's declaration, as a user
runs it (real `pgfence` processes on a real database).  Each change is
checked in the rows it leaves: pgfence.limits, and the held_back of the
kind's queued jobs.  Bad input is one line on stderr, exit 2, and the
limits and jobs exactly as they were."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from typing import Any

import psycopg
import pytest

from pgtools import env_for, pgfence, scalar, spawn
import pgfence as pgfence_api
from pgfence import enqueue
from pgfence.store import jobs as jobs_store

PASSWORD = "s3cret"
UNREACHABLE = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/x"

HEADER = "kind                     concurrency  per key      rate  running admitted  waiting scheduled  source"

#: A handler module that declares limits, as an application's would.
HANDLERS = '''
from pgfence import Job, handler


@handler("export", concurrency=4)
def export(job: Job) -> None:
    pass


@handler("sync", per_key_concurrency=1)
def sync(job: Job) -> None:
    pass
'''

#: The columns of pgfence.limits this command reads and writes.
COLUMNS = ("kind, declared_concurrency, declared_per_key, set_concurrency, set_per_key, concurrency, "
           "per_key_concurrency, updated_by")


def limits_rows(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(f"SELECT {COLUMNS} FROM pgfence.limits ORDER BY kind").fetchall()


def held_back(conn: psycopg.Connection, kind: str) -> list[tuple[int, bool, str | None]]:
    """(id, gated, held_back) of the kind's live jobs, by id."""
    return conn.execute("SELECT id, gated, held_back FROM pgfence.jobs WHERE kind = %s ORDER BY id",
                        (kind,)).fetchall()


def updated_at(conn: psycopg.Connection, kind: str) -> dt.datetime:
    return scalar(conn, "SELECT updated_at FROM pgfence.limits WHERE kind = %s", (kind,))


def limits_cli(dsn: str, *args: str) -> tuple[str, str, int, int]:
    """Run `pgfence limits ARGS` to its end: stdout, stderr, exit status and
    the process's pid (its `updated_by` is `cli HOST:PID`)."""
    proc = spawn("limits", *args, dsn=dsn)
    out, err = proc.communicate(timeout=60)
    return out, err, proc.returncode, proc.pid


def by(pid: int) -> str:
    return f"cli {socket.gethostname()}:{pid}"


Limits = tuple[int | None, int | None, str | None]   # concurrency, per key, rate


def row_json(kind: str, *, concurrency: int | None = None, per_key: int | None = None, rate: str | None = None,
             declared: Limits = (None, None, None), set_: Limits = (None, None, None),
             running: int = 0, admitted: int = 0, waiting: int = 0, scheduled: int = 0, keys: int = 0,
             updated_at: str, updated_by: str) -> dict[str, Any]:
    return {"kind": kind, "concurrency": concurrency, "per_key_concurrency": per_key, "rate": rate,
            "declared": {"concurrency": declared[0], "per_key_concurrency": declared[1], "rate": declared[2]},
            "set": {"concurrency": set_[0], "per_key_concurrency": set_[1], "rate": set_[2]},
            "running": running, "admitted": admitted, "waiting": waiting, "scheduled": scheduled, "keys": keys,
            "updated_at": updated_at, "updated_by": updated_by}


def printed_json(out: str, conn: psycopg.Connection, kind: str) -> str:
    """The `updated_at` a JSON row printed for ``kind``, checked against
    the database's value (the text is the database's, in the command's
    session time zone)."""
    data = json.loads(out)
    row = next(r for r in (data if isinstance(data, list) else [data]) if r["kind"] == kind)
    assert dt.datetime.fromisoformat(row["updated_at"]) == updated_at(conn, kind)
    return str(row["updated_at"])


def table(*rows: str) -> str:
    """The text `pgfence limits` prints for ``rows``, under its header."""
    return "".join(f"{line}\n" for line in (HEADER, *rows))


def exact_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def test_show_without_any_limit(dsn):
    out = pgfence("limits", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "no concurrency limits\n", "")
    out = pgfence("limits", "show", "--json", dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, "[]\n", "")


def test_set_gates_the_queued_jobs_and_reset_goes_back_to_the_handlers_limit(dsn, conn, tmp_path):
    # Five exports queued before any limit: nothing gates them.
    ids = [enqueue(conn, "export", {"n": n}) for n in range(5)]
    assert held_back(conn, "export") == [(i, False, None) for i in ids]

    out, err, code, pid = limits_cli(dsn, "set", "export", "--concurrency", "2")
    assert (code, err) == (0, "")
    assert out == table(
        "export                             2        -         -        0        2        3         0  set")
    assert limits_rows(conn) == [("export", None, None, 2, None, 2, None, by(pid))]
    # Exactly two admitted (the first two: same priority, oldest first), three waiting for a slot.
    assert held_back(conn, "export") == [(ids[0], True, None), (ids[1], True, None)] + \
        [(i, True, "concurrency") for i in ids[2:]]

    # A worker that loads the handler records its declared limit (4); the
    # one set at run time still wins.  (It serves another queue: it runs
    # none of the exports.)
    (tmp_path / "limited_jobs.py").write_text(HANDLERS)
    env = env_for(dsn)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    worker = pgfence("work", "--burst", "--handlers", "limited_jobs", "--queues", "elsewhere", env=env)
    assert worker.returncode == 0, worker.stderr
    declared_by = scalar(conn, "SELECT updated_by FROM pgfence.limits WHERE kind = 'export'")
    assert declared_by != by(pid)
    assert limits_rows(conn) == [("export", 4, None, 2, None, 2, None, declared_by),
                                 ("sync", None, 1, None, None, None, 1, declared_by)]
    assert [h for _i, _g, h in held_back(conn, "export")] == [None, None, "concurrency", "concurrency", "concurrency"]

    # Raised at run time, as JSON: one more admitted.
    out, err, code, pid = limits_cli(dsn, "set", "export", "--concurrency", "3", "--json")
    assert (code, err) == (0, "")
    assert out == exact_json(row_json("export", concurrency=3, declared=(4, None, None), set_=(3, None, None),
                                      admitted=3, waiting=2, updated_at=printed_json(out, conn, "export"),
                                      updated_by=by(pid)))
    assert limits_rows(conn)[0] == ("export", 4, None, 3, None, 3, None, by(pid))
    assert [h for _i, _g, h in held_back(conn, "export")] == [None, None, None, "concurrency", "concurrency"]

    # A per-key limit set beside the kind's: the concurrency stays as it was set.
    out, err, code, pid = limits_cli(dsn, "set", "export", "--per-key", "5")
    assert (code, err) == (0, "")
    assert out == table(
        "export                             3        5         -        0        3        2         0  set")
    assert limits_rows(conn)[0] == ("export", 4, None, 3, 5, 3, 5, by(pid))

    # Reset: the handler's 4 applies again, and admits one more.
    out, err, code, pid = limits_cli(dsn, "reset", "export")
    assert (code, err) == (0, "")
    assert out == table(
        "export                             4        -         -        0        4        1         0  handler")
    assert limits_rows(conn) == [("export", 4, None, None, None, 4, None, by(pid)),
                                 ("sync", None, 1, None, None, None, 1, declared_by)]
    assert held_back(conn, "export") == [(i, True, None) for i in ids[:4]] + [(ids[4], True, "concurrency")]

    out, err, code, _pid = limits_cli(dsn, "show", "--json")
    assert (code, err) == (0, "")
    assert out == exact_json([
        row_json("export", concurrency=4, declared=(4, None, None), admitted=4, waiting=1,
                 updated_at=printed_json(out, conn, "export"), updated_by=by(pid)),
        row_json("sync", per_key=1, declared=(None, 1, None), updated_at=printed_json(out, conn, "sync"),
                 updated_by=declared_by),
    ])


def test_a_kind_without_a_handler_limit_is_free_again_after_reset(dsn, conn):
    ids = [enqueue(conn, "noop") for _ in range(3)]
    out, err, code, pid = limits_cli(dsn, "set", "noop", "--concurrency", "1")
    assert (code, err) == (0, "")
    assert [h for _i, _g, h in held_back(conn, "noop")] == [None, "concurrency", "concurrency"]
    out, err, code, pid = limits_cli(dsn, "reset", "noop")
    assert (code, err) == (0, "")
    assert out == table(
        "noop                               -        -         -        0        0        0         0  none")
    # No limit is left on it, declared or set: its row goes.
    assert limits_rows(conn) == []
    # No limit applies any more: every job ungated and claimable.
    assert held_back(conn, "noop") == [(i, False, None) for i in ids]
    out, err, code, pid = limits_cli(dsn, "reset", "noop")
    assert (out, err, code) == ("", "pgfence: error: kind 'noop' has no limits to reset\n", 2)


def test_show_counts_running_admitted_waiting_scheduled_and_keys(dsn, conn):
    for args in (["set", "export", "--concurrency", "2"], ["set", "sync", "--per-key", "1"]):
        assert limits_cli(dsn, *args)[2] == 0
    exports = [enqueue(conn, "export") for _ in range(4)]
    later = enqueue(conn, "export", delay=3600)
    syncs = [enqueue(conn, "sync", concurrency_key=key) for key in ("customer:1", "customer:1", "customer:2")]
    # One export claimed (running), one admitted and not claimed yet.
    [claimed] = jobs_store.claim(conn, queues=["default"], batch=1, worker="w1", lease=30.0, lease_kinds=[],
                                 lease_secs=[], reclaim=False)
    assert claimed.id == exports[0]
    assert held_back(conn, "export") == [(exports[0], True, None), (exports[1], True, None),
                                         (exports[2], True, "concurrency"), (exports[3], True, "concurrency"),
                                         (later, True, "scheduled")]
    assert held_back(conn, "sync") == [(syncs[0], True, None), (syncs[1], True, "concurrency"),
                                       (syncs[2], True, None)]

    out, err, code, _pid = limits_cli(dsn)
    assert (code, err) == (0, "")
    assert out == table(
        "export                             2        -         -        1        1        2         1  set",
        "sync                               -        1         -        0        2        1         0  set")
    out, err, code, _pid = limits_cli(dsn, "--json")
    assert (code, err) == (0, "")
    [export_by, sync_by] = [r[-1] for r in limits_rows(conn)]
    assert out == exact_json([
        row_json("export", concurrency=2, set_=(2, None, None), running=1, admitted=1, waiting=2, scheduled=1,
                 updated_at=printed_json(out, conn, "export"), updated_by=export_by),
        row_json("sync", per_key=1, set_=(None, 1, None), admitted=2, waiting=1, keys=2,
                 updated_at=printed_json(out, conn, "sync"), updated_by=sync_by),
    ])


def test_a_rate_set_and_reset(dsn, conn):
    out, err, code, pid = limits_cli(dsn, "set", "webhook", "--rate", "5/2h", "--json")
    assert (code, err) == (0, "")
    assert out == exact_json(row_json("webhook", rate="5/7200s", set_=(None, None, "5/7200s"),
                                      updated_at=printed_json(out, conn, "webhook"), updated_by=by(pid)))
    assert conn.execute("SELECT set_rate_count, set_rate_period, rate_count, rate_period FROM pgfence.limits "
                        "WHERE kind = 'webhook'").fetchone() == (5, 7200.0, 5, 7200.0)
    out, err, code, pid = limits_cli(dsn, "set", "webhook", "--rate", "10/min")
    assert (code, err) == (0, "")
    assert out == table(
        "webhook                            -        -    10/min        0        0        0         0  set")
    # A rate gates the kind's jobs as a concurrency does: the first starts,
    # the next waits its turn (one every six seconds, no burst).
    first, second = enqueue(conn, "webhook"), enqueue(conn, "webhook")
    assert held_back(conn, "webhook") == [(first, True, None), (second, True, "concurrency")]
    out, err, code, pid = limits_cli(dsn, "reset", "webhook")
    assert (code, err) == (0, "")
    assert out == table(
        "webhook                            -        -         -        0        0        0         0  none")
    assert conn.execute("SELECT count(*) FROM pgfence.limits WHERE kind = 'webhook'").fetchone() == (0,)
    assert held_back(conn, "webhook") == [(first, False, None), (second, False, None)]


#: (arguments, exit status, the one line on stderr: all of it, or its start when it ends with ": ")
BAD_INPUT = [
    (["set", "export", "--concurrency", "0"], 2,
     "pgfence: error: invalid --concurrency: must be at least 1 (and at most 2147483647), got 0"),
    (["set", "export", "--concurrency", "-1"], 2,
     "pgfence: error: invalid --concurrency: must be at least 1 (and at most 2147483647), got -1"),
    (["set", "export", "--concurrency", "2147483648"], 2,
     "pgfence: error: invalid --concurrency: must be at least 1 (and at most 2147483647), got 2147483648"),
    (["set", "export", "--concurrency", "two"], 2,
     "pgfence: error: pgfence limits: argument --concurrency: invalid int value: 'two'"),
    (["set", "export", "--concurrency", "1.5"], 2,
     "pgfence: error: pgfence limits: argument --concurrency: invalid int value: '1.5'"),
    (["set", "export", "--per-key", "0"], 2,
     "pgfence: error: invalid --per-key: must be at least 1 (and at most 2147483647), got 0"),
    (["set", "export", "--concurrency", "3", "--per-key", "x"], 2,
     "pgfence: error: pgfence limits: argument --per-key: invalid int value: 'x'"),
    (["set", "export", "--rate", "fast"], 2,
     "pgfence: error: invalid --rate: must be starts per period such as '100/s', '10/min' or '5/2h', got 'fast'"),
    (["set", "export", "--rate", "0/s"], 2,
     "pgfence: error: invalid --rate: must be starts per period such as '100/s', '10/min' or '5/2h', got '0/s'"),
    (["reset", "export", "--rate", "1/s"], 2,
     "pgfence: error: pgfence limits reset takes no limit: it goes back to the handler's"),
    (["set", "bad kind", "--concurrency", "2"], 2,
     "pgfence: error: invalid kind name 'bad kind': must be 1 to 128 letters, digits, '_', '.', ':' or '-', "
     "starting with a letter or a digit"),
    (["set", "export"], 2, "pgfence: error: pgfence limits set: give --concurrency, --per-key, --rate, or several"),
    (["set", "--concurrency", "2"], 2, "pgfence: error: pgfence limits set: give the kind"),
    (["reset"], 2, "pgfence: error: pgfence limits reset: give the kind"),
    (["reset", "never_limited"], 2, "pgfence: error: kind 'never_limited' has no limits to reset"),
    (["reset", "export", "--concurrency", "3"], 2,
     "pgfence: error: pgfence limits reset takes no limit: it goes back to the handler's"),
    (["show", "export"], 2,
     "pgfence: error: pgfence limits show takes no kind or limit (set KIND --concurrency N)"),
    (["--concurrency", "3"], 2,
     "pgfence: error: pgfence limits show takes no kind or limit (set KIND --concurrency N)"),
    (["raise", "export"], 2,
     "pgfence: error: pgfence limits: argument action: invalid choice: 'raise' (choose from 'show', 'set', 'reset')"),
    (["set", "export", "--concurrency", "3", "--dsn", UNREACHABLE], 1,
     "pgfence: error: database unreachable (user=postgres dbname=x host=127.0.0.1 port=1): "),
]


@pytest.mark.server_only   # command lines refused before any statement but one, which changes nothing
def test_bad_input_is_one_line_and_leaves_the_limits_as_they_were(dsn, conn):
    assert limits_cli(dsn, "set", "export", "--concurrency", "2")[2] == 0
    for _ in range(3):
        enqueue(conn, "export")

    def snapshot() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        return (conn.execute("SELECT * FROM pgfence.limits ORDER BY kind").fetchall(),
                conn.execute("SELECT id, status, gated, held_back FROM pgfence.jobs ORDER BY id").fetchall())

    before = snapshot()
    assert [h for *_rest, h in before[1]] == [None, None, "concurrency"]
    procs = [(args, status, line, spawn("limits", *args, dsn=dsn)) for args, status, line in BAD_INPUT]
    failures = {}
    for args, status, line, proc in procs:
        out, err = proc.communicate(timeout=60)
        one_line = err.endswith("\n") and err.count("\n") == 1
        said = err.startswith(line) if line.endswith(": ") else err == line + "\n"
        if (proc.returncode, out, one_line, said) != (status, "", True, True) or PASSWORD in out + err:
            failures[" ".join(args)] = (proc.returncode, out, err)
    assert failures == {}
    assert snapshot() == before


def test_enqueue_takes_a_concurrency_key(dsn, conn):
    limits_cli(dsn, "set", "sync", "--per-key", "1")
    ids = []
    for key in ("customer:1", "customer:1", "customer:2"):
        out = pgfence("enqueue", "sync", "--any-kind", "--concurrency-key", key, dsn=dsn)
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        ids.append(int(out.stdout))
    assert held_back(conn, "sync") == [(ids[0], True, None), (ids[1], True, "concurrency"), (ids[2], True, None)]
    assert [pgfence_api.get_job(conn, i).concurrency_key for i in ids] == ["customer:1", "customer:1", "customer:2"]
    out = pgfence("enqueue", "sync", "--any-kind", "--concurrency-key", "x" * 201, dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (
        2, "", "pgfence: error: invalid concurrency key: at most 200 characters, got 201\n")
    assert len(held_back(conn, "sync")) == 3
