"""The command line as a user meets it: real subprocesses, real exit codes.

Bad input ends as one line on stderr starting with ``pgfence: error:``,
never a traceback, and nothing is written.
"""

from __future__ import annotations

import json
import urllib.parse
import os
import time
from dataclasses import dataclass, field

import psycopg
import pytest

import pgfence.handlers.builtin  # noqa: F401 - registers noop & co. before the registry snapshot
from pgtools import env_for, finish, job_row, pgfence, scalar, spawn, wait_for
from pgfence import LeaseLost, enqueue, settings as settings_mod
from pgfence.errors import ConfigError
from pgfence.renewal.renewer import HeartbeatManager
from pgfence.handlers.tables import INSERT_EFFECT
from pgfence.settings import Settings
from pgfence.worker.engine import Worker

PASSWORD = "s3cret"
UNREACHABLE = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/x"


@dataclass
class Case:
    name: str
    args: list[str]
    code: int
    fragment: str
    env: dict[str, str] = field(default_factory=dict)
    toml: str | None = None      # written to a file passed as --config


def run_cases(cases: list[Case], dsn: str | None, tmp_path) -> list[tuple[Case, str, str, int]]:
    """Run every case as its own subprocess, all at once."""
    procs = []
    for case in cases:
        args = list(case.args)
        if case.toml is not None:
            path = tmp_path / f"{case.name}.toml"
            path.write_text(case.toml)
            args += ["--config", str(path)]
        procs.append((case, spawn(*args, env=env_for(dsn, **case.env))))
    return [(case, *proc.communicate(timeout=60), proc.returncode) for case, proc in procs]


def problems_of(case: Case, out: str, err: str, code: int) -> list[str]:
    found = []
    if code != case.code:
        found.append(f"exit {code}, expected {case.code}")
    if "Traceback" in out + err:
        found.append("a traceback")
    lines = err.splitlines()
    if len(lines) != 1 or not lines[0].startswith("pgfence: error: ") or not err.endswith("\n"):
        found.append(f"stderr is not one 'pgfence: error:' line: {err!r}")
    if case.fragment not in err:
        found.append(f"{case.fragment!r} not in stderr {err!r}")
    if out:
        found.append(f"stdout not empty: {out!r}")
    if PASSWORD in out + err or "s3cr" in out + err:
        found.append("the password was printed")
    return found


def snapshot(conn: psycopg.Connection) -> dict:
    return {
        "jobs": conn.execute("SELECT * FROM pgfence.all_jobs ORDER BY id").fetchall(),
        "effects": scalar(conn, "SELECT count(*) FROM pgfence_examples.effects"),
        "receipts": scalar(conn, "SELECT count(*) FROM pgfence_examples.receipts"),
    }


BAD_INPUT = [
    Case("malformed_json", ["enqueue", "noop", "--payload", '{"a": 1'], 2,
         "invalid --payload: not JSON (Expecting"),
    Case("nan_payload", ["enqueue", "noop", "--payload", '{"a": NaN}'], 2,
         "invalid --payload: not JSON (NaN is not a JSON value)"),
    Case("nul_in_payload", ["enqueue", "noop", "--payload", '"\\u0000"'], 2, "NUL character"),
    Case("unknown_kind", ["enqueue", "no_such_kind"], 2, "unknown job kind 'no_such_kind' (known: "),
    Case("unknown_handler_module", ["enqueue", "noop", "--handlers", "no.such.module"], 2,
         "cannot import handler module 'no.such.module'"),
    Case("negative_delay", ["enqueue", "noop", "--delay", "-5"], 2, "invalid --delay"),
    Case("bad_run_at", ["enqueue", "noop", "--run-at", "next tuesday"], 2, "invalid --run-at"),
    Case("delay_and_run_at", ["enqueue", "noop", "--delay", "5", "--run-at", "2031-01-01"], 2,
         "not allowed with argument"),
    Case("max_attempts_zero", ["enqueue", "noop", "--max-attempts", "0"], 2, "invalid max-attempts"),
    Case("priority_not_a_number", ["enqueue", "noop", "--priority", "high"], 2, "invalid int value: 'high'"),
    Case("priority_out_of_range", ["enqueue", "noop", "--priority", "99999999999"], 2,
         "invalid priority: must be between -2147483648 and 2147483647, got 99999999999"),
    Case("max_attempts_out_of_range", ["enqueue", "noop", "--max-attempts", "2147483648"], 2, "invalid max-attempts"),
    Case("negative_max_jobs", ["work", "--burst", "--max-jobs", "-1"], 2,
         "invalid --max-jobs: must be at least 1, got -1"),
    Case("empty_worker_name", ["work", "--burst", "--name", ""], 2,
         "invalid --name: must be 1 to 128 printable characters, got 0 character(s)"),
    Case("long_worker_name", ["work", "--burst", "--name", "w" * 1000], 2,
         "invalid --name: must be 1 to 128 printable characters, got 1000 character(s)"),
    Case("negative_lease", ["work", "--burst", "--lease", "-3"], 2, "invalid lease"),
    Case("zero_lease", ["work", "--burst", "--lease", "0"], 2,
         "invalid lease: must be a number of seconds from 0.1s to 7d, got 0.0"),
    # Out of range: a huge lease overflowed the database's timestamps and
    # crash-looped the children; a tiny one ends before the claim returns.
    Case("huge_lease", ["work", "--burst", "--lease", "1e13"], 2,
         "invalid lease: must be a number of seconds from 0.1s to 7d, got 10000000000000.0"),
    Case("tiny_lease", ["work", "--burst", "--lease", "0.001"], 2,
         "invalid lease: must be a number of seconds from 0.1s to 7d, got 0.001"),
    Case("run_huge_lease", ["run", "--lease", "1e13"], 2, "invalid lease: must be a number of seconds from 0.1s"),
    Case("huge_heartbeat", ["work", "--burst", "--lease", "7d", "--heartbeat", "3d"], 2,
         "invalid heartbeat: must be a number of seconds from 0.05s to 1d, got 259200.0"),
    Case("huge_timeout", ["work", "--burst", "--timeout", "1e13"], 2, "invalid timeout: must be a number of seconds"),
    Case("huge_poll_interval", ["work", "--burst", "--poll-interval", "2h"], 2,
         "invalid poll-interval: must be a number of seconds from 0.01s to 1h, got 7200.0"),
    Case("env_huge_retention", ["work", "--burst"], 2, "invalid retention: must be a number of seconds",
         env={"PGFENCE_RETENTION": "1e13"}),
    Case("toml_huge_backoff", ["work", "--burst"], 2, "invalid backoff-max: must be a number of seconds",
         toml="backoff_max = 1e13\n"),
    Case("batch_zero", ["work", "--burst", "--batch", "0"], 2, "invalid batch: must be a whole number of at least 1"),
    Case("batch_not_whole", ["work", "--burst", "--batch", "2.5"], 2, "invalid batch: expected a whole number"),
    Case("heartbeat_not_shorter", ["work", "--burst", "--lease", "5", "--heartbeat", "5"], 2, "invalid heartbeat"),
    Case("env_lease", ["work", "--burst"], 2, "invalid lease", env={"PGFENCE_LEASE": "-3"}),
    Case("env_batch", ["work", "--burst"], 2, "invalid batch", env={"PGFENCE_BATCH": "many"}),
    Case("env_log_level", ["enqueue", "noop"], 2, "invalid log-level", env={"PGFENCE_LOG_LEVEL": "chatty"}),
    Case("toml_bad_value", ["work", "--burst"], 2, "invalid lease", toml='lease = "soon"\n'),
    Case("toml_batch_zero", ["work", "--burst"], 2, "invalid batch", toml="[pgfence]\nbatch = 0\n"),
    Case("toml_float_batch", ["work", "--burst"], 2, "invalid batch", toml="batch = 1.5\n"),
    Case("toml_unknown_key", ["work", "--burst"], 2, "unknown setting 'leas'", toml="leas = 3\n"),
    Case("toml_syntax", ["work", "--burst"], 2, "invalid config file", toml="lease = \n"),
    Case("missing_config", ["work", "--burst", "--config", "/nonexistent/pgfence.toml"], 2,
         "config file not found"),
    Case("retry_nothing", ["retry"], 2, "give job ids or --failed"),
    Case("retry_bad_id", ["retry", "seven"], 2, "invalid int value: 'seven'"),
    Case("prune_zero", ["prune", "--retention", "0"], 2,
         "invalid --retention: must be a number of seconds from 1s to 3650d, got 0.0"),
    Case("prune_huge", ["prune", "--retention", "1e13"], 2, "invalid --retention: must be a number of seconds"),
    Case("prune_garbage", ["prune", "--retention", "forever"], 2, "invalid --retention"),
    Case("unknown_command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
]


@pytest.mark.server_only   # 40 command lines refused before any statement is sent
def test_bad_input_is_one_line_nonzero_and_writes_nothing(dsn, conn, tmp_path):
    # A queued job that a `work --burst` which failed to validate would run.
    seeded = enqueue(conn, "effect", {"seconds": 0})
    before = snapshot(conn)
    results = run_cases(BAD_INPUT, dsn, tmp_path)
    failures = {case.name: p for case, out, err, code in results if (p := problems_of(case, out, err, code))}
    assert failures == {}
    assert snapshot(conn) == before
    assert job_row(conn, seeded)["status"] == "queued"


def test_unreachable_or_invalid_dsn_is_one_line_without_the_password(tmp_path):
    unreachable = "pgfence: error: database unreachable (user=postgres dbname=x host=127.0.0.1 port=1): "
    cases = [
        Case("status", ["status", "--dsn", UNREACHABLE], 1, unreachable),
        Case("status_json_debug", ["status", "--json", "--log-level", "DEBUG", "--dsn", UNREACHABLE], 1,
             unreachable),
        Case("enqueue", ["enqueue", "noop", "--dsn", UNREACHABLE], 1, unreachable),
        Case("migrate", ["migrate", "--dsn", UNREACHABLE], 1, unreachable),
        Case("work", ["work", "--burst", "--log-level", "DEBUG", "--dsn", UNREACHABLE], 1, unreachable),
        Case("prune", ["prune", "--dsn", UNREACHABLE], 1, unreachable),
        Case("retry", ["retry", "1"], 1, unreachable, env={"PGFENCE_DSN": UNREACHABLE}),
        Case("cancel", ["cancel", "1"], 1, unreachable, env={"DATABASE_URL": UNREACHABLE}),
        Case("kv_dsn", ["status", "--dsn", f"host=127.0.0.1 port=1 user=postgres dbname=x password={PASSWORD}"],
             1, unreachable),
        # libpq quotes (parts of) a DSN it cannot parse: the password must not leak that way.
        Case("bad_ipv6_uri", ["status", "--dsn", f"postgresql://postgres:{PASSWORD}@[::1/x"], 1, "invalid DSN: "),
        Case("bad_percent", ["status", "--dsn", f"postgresql://postgres:{PASSWORD}%zz@127.0.0.1:1/x"], 1,
             "invalid DSN: invalid percent-encoded token"),
        Case("bad_query", ["status", "--dsn", f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/x?bogus=1"], 1,
             "invalid DSN: "),
        Case("bad_kv", ["status", "--dsn", f"host=127.0.0.1 password='{PASSWORD}"], 1, "invalid DSN: "),
    ]
    results = run_cases(cases, None, tmp_path)
    failures = {case.name: p for case, out, err, code in results if (p := problems_of(case, out, err, code))}
    assert failures == {}

    out = pgfence("dsn", "--dsn", UNREACHABLE)
    assert (out.returncode, out.stderr) == (0, "")
    assert PASSWORD not in out.stdout
    assert out.stdout == "user=postgres dbname=x host=127.0.0.1 port=1\n"


# -- status ----------------------------------------------------------------------


def add_finished(conn: psycopg.Connection, queue: str, status: str) -> int:
    return scalar(conn, """
        INSERT INTO pgfence.job_history (kind, queue, status, attempt, started_at, finished_at, last_error)
        VALUES ('noop', %s, %s, 1, now(), now(), CASE WHEN %s <> 'done' THEN 'boom' END) RETURNING id""",
                  (queue, status, status))


@pytest.fixture
def make_worker(dsn):
    made: list[Worker] = []

    def make(name: str, heartbeat: HeartbeatManager | None = None, **options) -> Worker:
        worker = Worker(dsn, Settings(**options), name=name, heartbeat=heartbeat)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


def test_status_counts_and_running_jobs(dsn, conn, make_worker):
    enqueue(conn, "noop", queue="alpha")
    enqueue(conn, "noop", queue="alpha")
    top = enqueue(conn, "noop", queue="alpha", priority=5)
    again = enqueue(conn, "sleep", queue="alpha", priority=9)
    add_finished(conn, "alpha", "done")
    add_finished(conn, "beta", "failed")
    add_finished(conn, "beta", "cancelled")
    conn.execute("SELECT pgfence.enqueue('noop', '{}', 'beta', 0, now() + interval '1 hour')")

    # `again` is claimed, its lease runs out and another worker reclaims it: attempt 2.
    [lost] = make_worker("w-gone", lease=0.2, queues=("alpha",)).claim()
    assert lost.id == again
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (again,)),
             timeout=10, message="the lease to expire")
    claimed_at = time.monotonic()
    jobs = make_worker("w-status", lease=30, queues=("alpha",)).claim(2)
    assert [(j.id, j.attempt) for j in jobs] == [(again, 2), (top, 1)]

    out = pgfence("status", "--json", dsn=dsn)
    elapsed = time.monotonic() - claimed_at
    assert (out.returncode, out.stderr) == (0, "")
    data = json.loads(out.stdout)
    assert data["queues"] == {"alpha": {"queued": 2, "running": 2, "done": 1},
                              "beta": {"queued": 1, "failed": 1, "cancelled": 1}}
    leases = [r.pop("lease_left") for r in data["running"]]
    assert data["running"] == [
        {"id": min(top, again), "queue": "alpha", "kind": "noop" if top < again else "sleep",
         "attempt": 1 if top < again else 2, "locked_by": "w-status"},
        {"id": max(top, again), "queue": "alpha", "kind": "sleep" if top < again else "noop",
         "attempt": 2 if top < again else 1, "locked_by": "w-status"},
    ]
    for left in leases:
        assert 30 - elapsed - 1 <= left <= 30

    out = pgfence("status", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["queue", "queued", "running", "done", "failed", "cancelled"]
    assert lines[1].split() == ["alpha", "2", "2", "1", "0", "0"]
    assert lines[2].split() == ["beta", "1", "0", "0", "1", "1"]
    assert lines[3] == ""
    assert lines[4].split() == ["running", "id", "queue", "kind", "attempt", "lease", "left", "owner"]
    rows = [line.split() for line in lines[5:]]
    assert [r[:4] + r[5:] for r in rows] == [
        [str(top), "alpha", "noop", "1", "w-status"], [str(again), "alpha", "sleep", "2", "w-status"]
    ] if top < again else [
        [str(again), "alpha", "sleep", "2", "w-status"], [str(top), "alpha", "noop", "1", "w-status"]]
    for r in rows:
        assert r[4].endswith("s") and 0 < float(r[4][:-1]) <= 30


def test_status_of_an_empty_queue(dsn):
    out = pgfence("status", "--json", dsn=dsn)
    assert (out.returncode, json.loads(out.stdout), out.stderr) == \
        (0, {"queues": {}, "running": [], "estimated": False}, "")


# -- retry and cancel --------------------------------------------------------------


def test_retry_ids_and_failed(dsn, conn, make_worker):
    failed1 = scalar(conn, """
        INSERT INTO pgfence.job_history (kind, status, attempt, max_attempts, reclaims, started_at, finished_at, last_error)
        VALUES ('noop', 'failed', 3, 3, 2, now(), now() - interval '1 minute', 'boom') RETURNING id""")
    failed2 = add_finished(conn, "default", "failed")
    cancelled = add_finished(conn, "default", "cancelled")
    done = add_finished(conn, "default", "done")
    queued = enqueue(conn, "noop", priority=-1)

    before = scalar(conn, "SELECT clock_timestamp()")
    out = pgfence("retry", str(failed1), dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"requeued 1 job(s): {failed1}\n", "")
    row = job_row(conn, failed1)
    assert (row["status"], row["attempt"], row["max_attempts"], row["reclaims"], row["last_error"]) == \
        ("queued", 3, 4, 0, "boom")
    assert (row["finished_at"], row["locked_by"], row["lease_until"]) == (None, None, None)
    assert before <= row["run_at"] <= scalar(conn, "SELECT clock_timestamp()")
    assert job_row(conn, failed2)["status"] == "failed"

    out = pgfence("retry", str(cancelled), str(done), str(queued), "999999", dsn=dsn)
    assert (out.returncode, out.stdout) == (0, f"requeued 1 job(s): {cancelled}\n")
    assert [job_row(conn, i)["status"] for i in (cancelled, done, queued)] == ["queued", "done", "queued"]

    out = pgfence("retry", "--failed", dsn=dsn)
    assert (out.returncode, out.stdout) == (0, f"requeued 1 job(s): {failed2}\n")
    out = pgfence("retry", "--failed", dsn=dsn)
    assert (out.returncode, out.stdout) == (0, "requeued 0 job(s)\n")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'failed'") == 0

    # The retried job gets exactly one more attempt.
    jobs = {j.id: j for j in make_worker("w-retry").claim(10)}
    assert jobs[failed1].attempt == 4


def add_failed_with_key(conn: psycopg.Connection, key: str | None) -> int:
    return scalar(conn, """
        INSERT INTO pgfence.job_history (kind, status, attempt, started_at, finished_at, last_error, dedupe_key)
        VALUES ('noop', 'failed', 1, now(), now(), 'boom', %s) RETURNING id""", (key,))


def test_retry_skips_jobs_whose_dedupe_key_a_live_job_holds_and_requeues_the_others(dsn, conn):
    """Issue 10, point 9: one job that would break the dedupe index no
    longer aborts the retry of every other job."""
    held = add_failed_with_key(conn, "k1")
    free = add_failed_with_key(conn, None)
    live = enqueue(conn, "noop", dedupe_key="k1")
    twin_a = add_failed_with_key(conn, "k2")   # two failed jobs with one key:
    twin_b = add_failed_with_key(conn, "k2")   # only the older goes back

    out = pgfence("retry", str(held), str(free), dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == \
        (1, f"requeued 1 job(s): {free}\n", f"pgfence: skipped job {held}: job {live} holds its dedupe key\n")
    assert [job_row(conn, i)["status"] for i in (held, free, live)] == ["failed", "queued", "queued"]

    out = pgfence("retry", "--failed", dsn=dsn)
    assert (out.returncode, out.stdout) == (1, f"requeued 1 job(s): {twin_a}\n")
    assert out.stderr == (f"pgfence: skipped job {held}: job {live} holds its dedupe key\n"
                          f"pgfence: skipped job {twin_b}: job {twin_a} holds its dedupe key\n")
    assert [job_row(conn, i)["status"] for i in (held, twin_a, twin_b)] == ["failed", "queued", "failed"]
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'queued'") == 3

    # Once the holder is done, the skipped job goes back.
    finish(conn, live)
    out = pgfence("retry", str(held), dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"requeued 1 job(s): {held}\n", "")


def test_cancel_running_job_owner_learns_at_next_renewal(dsn, conn, make_worker):
    running = enqueue(conn, "effect", priority=1)
    queued = enqueue(conn, "noop", queue="other")
    done = add_finished(conn, "default", "done")
    heartbeat = HeartbeatManager(dsn, default_lease=30)
    try:
        worker = make_worker("w-cancel", heartbeat=heartbeat, lease=30)
        [job] = worker.claim()
        assert job.id == running
        first = heartbeat.run_once()
        assert (first.sent, first.renewed, first.lost) == (1, 1, {})

        out = pgfence("cancel", str(running), str(queued), str(done), dsn=dsn)
        assert (out.returncode, out.stderr) == (0, "")
        assert out.stdout == f"cancelled 2 job(s): {' '.join(map(str, sorted([running, queued])))}\n"
        row = job_row(conn, running)
        assert (row["status"], row["attempt"], row["locked_by"], row["lease_until"], row["last_error"]) == \
            ("cancelled", 1, None, None, "cancelled by an operator")
        assert row["finished_at"] is not None
        assert job_row(conn, queued)["status"] == "cancelled"
        assert job_row(conn, done)["status"] == "done"
        assert not job.lease_lost     # not known before the next renewal

        second = heartbeat.run_once()
        assert (second.sent, second.renewed, second.lost) == (1, 0, {"cancelled": 1})
        assert job.lease.lost_reason == "cancelled"
        with pytest.raises(LeaseLost) as lost:
            job.check()
        assert lost.value.reason == "cancelled"
        # A completion after the cancel is rolled back with its writes.
        with pytest.raises(LeaseLost):
            with job.fenced() as c:
                c.execute(INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "key": "k", "worker": "w"})
        assert scalar(conn, "SELECT count(*) FROM pgfence_examples.effects") == 0
        assert job_row(conn, running)["status"] == "cancelled"
        # A lost lease is not renewed again.
        assert heartbeat.run_once().sent == 0
    finally:
        heartbeat.stop()

    out = pgfence("cancel", str(running), dsn=dsn)
    assert (out.returncode, out.stdout, out.stderr) == (1, "cancelled 0 job(s)\n", "")


# -- settings ----------------------------------------------------------------------


def test_settings_precedence_toml_then_env_then_cli(tmp_path):
    path = tmp_path / "pgfence.toml"
    path.write_text('[pgfence]\nlease = "20s"\nbatch = 2\npoll-interval = 9\nqueues = ["a", "b"]\n')
    other = tmp_path / "other.toml"
    other.write_text("lease = 40\ntimeout = \"2m\"\n")

    s = settings_mod.load({}, env={}, config_path=str(path))
    assert (s.lease, s.batch, s.poll_interval, s.queues) == (20.0, 2, 9.0, ("a", "b"))
    assert (s.heartbeat, s.timeout, s.retention) == (None, None, 7 * 86400.0)     # untouched defaults

    env = {"PGFENCE_LEASE": "15", "PGFENCE_BATCH": "3", "PGFENCE_CONFIG": str(other), "PGFENCE_NOT_A_SETTING": "x"}
    s = settings_mod.load({}, env=env, config_path=str(path))   # --config wins over PGFENCE_CONFIG
    assert (s.lease, s.batch, s.poll_interval, s.queues, s.timeout) == (15.0, 3, 9.0, ("a", "b"), None)

    s = settings_mod.load({"lease": "10", "batch": None, "queues": "c"}, env=env, config_path=str(path))
    assert (s.lease, s.batch, s.poll_interval, s.queues) == (10.0, 3, 9.0, ("c",))

    s = settings_mod.load({}, env=env)                          # PGFENCE_CONFIG when no --config
    assert (s.lease, s.timeout, s.batch) == (15.0, 120.0, 3)
    assert settings_mod.load({}, env={}) == Settings()

    with pytest.raises(ConfigError, match="invalid lease"):
        settings_mod.load({"lease": "-3"}, env={})
    with pytest.raises(ConfigError, match="invalid batch"):
        settings_mod.load({}, env={"PGFENCE_BATCH": "0"})


def test_work_command_applies_the_settings_precedence(dsn, conn, tmp_path):
    path = tmp_path / "pgfence.toml"
    path.write_text('queues = ["a", "b"]\nlease = "20s"\n')
    in_a = enqueue(conn, "noop", queue="a")
    in_default = enqueue(conn, "noop")

    def work(*args: str, **env: str):
        out = pgfence("work", "--burst", "--name", "w-set", "--config", str(path), *args,
                      env=env_for(dsn, **env))
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert "worker w-set on queues a,b (lease 20.0s," in work()
    assert "worker w-set on queues a,b (lease 15.0s," in work(PGFENCE_LEASE="15")
    assert "worker w-set on queues b (lease 10.0s," in work("--lease", "10", "--queues", "b", PGFENCE_LEASE="15")
    # The TOML's queues were used: the job in "a" ran, the one in "default" did not.
    assert (job_row(conn, in_a)["status"], job_row(conn, in_default)["status"]) == ("done", "queued")


@pytest.mark.parametrize("command", ["work", "run"])
def test_pooling_switches_reach_the_settings(command):
    from pgfence.cli.common import command_settings
    from pgfence.cli.main import build_parser

    plain = command_settings(build_parser().parse_args([command]))
    assert (plain.listen, plain.prepare) == (True, True)
    pooled = command_settings(build_parser().parse_args([command, "--no-listen", "--no-prepare"]))
    assert (pooled.listen, pooled.prepare) == (False, False)
    assert settings_mod.load({}, env={"PGFENCE_PREPARE": "off"}).prepare is False
    with pytest.raises(ConfigError, match="invalid prepare: expected true or false"):
        settings_mod.load({}, env={"PGFENCE_PREPARE": "sometimes"})


# -- large payloads and NUL (issue 10, point 18) ---------------------------------------


def test_enqueue_reads_a_large_payload_from_a_file_or_stdin(dsn, conn, tmp_path):
    payload = {"blob": "é" * 150_000, "n": 1}       # 300 KB of UTF-8: more than argv carries
    text = json.dumps(payload, ensure_ascii=False)
    assert len(text.encode()) > 200_000
    path = tmp_path / "payload.json"
    path.write_text(text, encoding="utf-8")

    out = pgfence("enqueue", "noop", "--payload", f"@{path}", dsn=dsn)
    assert (out.returncode, out.stderr) == (0, "")
    assert job_row(conn, int(out.stdout))["payload"] == payload

    out = pgfence("enqueue", "noop", "--payload", "-", dsn=dsn, input=text)
    assert (out.returncode, out.stderr) == (0, "")
    assert job_row(conn, int(out.stdout))["payload"] == payload
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 2


def test_enqueue_payload_usage_errors_are_one_line_and_write_nothing(dsn, conn, tmp_path):
    nul = tmp_path / "nul.json"
    nul.write_text('{"a": ["x\\u0000y"]}')
    cases = [
        (["--payload", '"\\u0000"'], None, "NUL character"),
        (["--payload", '{"k\\u0000": 1}'], None, "NUL character"),
        (["--payload", f"@{nul}"], None, "NUL character"),
        (["--payload", "-"], '{"a": "\\u0000"}', "NUL character"),
        (["--payload", f"@{tmp_path / 'missing.json'}"], None, "cannot read"),
        (["--payload", "-"], "not json", "not JSON"),
    ]
    for args, stdin, fragment in cases:
        out = pgfence("enqueue", "noop", *args, dsn=dsn, input=stdin)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert out.stderr.startswith("pgfence: error: ") and out.stderr.count("\n") == 1, (args, out.stderr)
        assert fragment in out.stderr, (args, out.stderr)
    # A backslash followed by u0000 is text, not NUL.
    out = pgfence("enqueue", "noop", "--payload", '"\\\\u0000"', dsn=dsn)
    assert out.returncode == 0, out.stderr
    assert job_row(conn, int(out.stdout))["payload"] == "\\u0000"
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 1


# -- the DSN password in ps and in usage errors -------------------------------------


def uri_with_password(dsn: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    # The test server trusts every connection: the password is never asked for.
    if params["host"].startswith("/"):   # the embedded server: a Unix socket folder, no port
        return (f"postgresql://{params['user']}:{PASSWORD}@/{params['dbname']}"
                f"?host={urllib.parse.quote(params['host'], safe='')}")
    return f"postgresql://{params['user']}:{PASSWORD}@{params['host']}:{params['port']}/{params['dbname']}"


def cmdline(pid: int) -> str:
    """What ps shows of a process: its argv as the kernel holds it."""
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()


def descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def workers_connected(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND application_name LIKE 'pgfence worker %%'")


def test_ps_never_shows_the_dsn_password(dsn, conn):
    uri = uri_with_password(dsn)
    work = spawn("work", "--dsn", uri, "--queues", "hidden_q", "--poll-interval", "0.5", env=env_for(None))
    run = spawn("run", f"--dsn={uri}", "--workers", "1", "--queues", "hidden_r", env=env_for(None))
    try:
        wait_for(lambda: workers_connected(conn) >= 2, message="both commands' workers connected")
        titles = {pid: cmdline(pid) for pid in [work.pid, run.pid, *descendants(run.pid)]}
        assert all(PASSWORD not in title for title in titles.values()), titles
        masked = uri.replace(PASSWORD, "***")
        assert titles[work.pid] == f"pgfence work --dsn {masked} --queues hidden_q --poll-interval 0.5"
        assert titles[run.pid].startswith("pgfence arbiter [1 workers] queues=hidden_r"), titles
        assert sorted(titles[pid].split(" [")[0] for pid in descendants(run.pid)) == \
            ["pgfence heartbeat", "pgfence worker 1 idle"], titles
    finally:
        for proc in (work, run):
            proc.terminate()
        for proc in (work, run):
            out, err = proc.communicate(timeout=60)
            assert PASSWORD not in out + err
    assert (work.returncode, run.returncode) == (0, 0)


def test_usage_errors_never_print_the_dsn_password(tmp_path):
    uri = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/x"
    kv = f"host=127.0.0.1 port=1 password={PASSWORD} dbname=x"
    cases = [
        Case("mistyped_flag", ["run", "--dns", uri], 2, "pgfence: unrecognized arguments: --dns ***"),
        Case("mistyped_flag_equals", ["work", f"--dns={uri}"], 2, "pgfence: unrecognized arguments: ***"),
        Case("kv_mistyped", ["status", "--dns", kv], 2, "pgfence: unrecognized arguments: --dns ***"),
        Case("dsn_as_command", [uri], 2, "argument command: invalid choice: '***'"),
        Case("extra_after_dsn", ["status", "--dsn", uri, uri], 2, "unrecognized arguments: ***"),
    ]
    results = run_cases(cases, None, tmp_path)
    failures = {case.name: p for case, out, err, code in results if (p := problems_of(case, out, err, code))}
    assert failures == {}


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_that_closes_the_pipe_early_is_not_an_error_of_ours(tmp_path, buffered):
    """`pgfence embedded status | grep -q running`: the reader may close the
    pipe before pgfence has written everything.  That is reported as no
    'database unreachable: [Errno 32] Broken pipe' (the line .ci/wheel-smoke
    once failed on), no traceback: pgfence exits 141, as SIGPIPE would end it."""
    env = env_for()
    env["PGFENCE_HOME"] = str(tmp_path / "home")
    if buffered:
        env.pop("PYTHONUNBUFFERED", None)
    read_end, write_end = os.pipe()
    os.close(read_end)                  # the reader is gone before the first write
    try:
        proc = spawn("embedded", "status", env=env, stdout=write_end)
    finally:
        os.close(write_end)
    _out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, "")


def test_a_database_broken_pipe_is_still_reported(monkeypatch, capsys):
    """The same error raised by something else than standard output (a
    socket to the database, say) stays one clear line and exit 1."""
    from pgfence.cli import main as cli_main

    def broken(_args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli_main.COMMANDS, "status", broken)
    assert cli_main.main(["status", "--dsn", "postgresql://postgres@127.0.0.1:1/x"]) == 1
    assert capsys.readouterr().err == "pgfence: error: database unreachable: [Errno 32] Broken pipe\n"
