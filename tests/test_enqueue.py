"""Enqueue: dedupe keys, idempotency keys, transactional enqueue, the SQL
function and the CLI's options."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import psycopg
import pytest

import pgfence.handlers.builtin  # noqa: F401 - registers noop & co. before the registry snapshot
from pgtools import finish, job_row, pgfence, scalar, wait_for
from pgfence import ConfigError, DatabaseError, aenqueue, enqueue, enqueue_many, handler
from pgfence.job import idempotency_key

UTC = dt.timezone.utc


def count_jobs(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM pgfence.all_jobs")


def test_dedupe_key_returns_the_live_job_then_a_new_one_after_it_finished(conn, make_worker):
    conn.execute("SET statement_timeout = '10s'")    # a looping pgfence.enqueue fails, not hangs
    first = enqueue(conn, "noop", {"n": 1}, dedupe_key="order-7")
    assert enqueue(conn, "noop", {"n": 2}, dedupe_key="order-7") == first      # queued
    other_kind = enqueue(conn, "effect", dedupe_key="order-7")                  # the key is per kind
    assert other_kind != first
    assert count_jobs(conn) == 2
    assert job_row(conn, first)["payload"] == {"n": 1}   # the duplicate changed nothing

    worker = make_worker("w-dd")
    [job] = worker.claim()
    assert job.id == first and job_row(conn, first)["status"] == "running"
    assert enqueue(conn, "noop", {"n": 3}, dedupe_key="order-7") == first      # running
    assert count_jobs(conn) == 2

    with job.fenced():
        pass
    assert job_row(conn, first)["status"] == "done"
    second = enqueue(conn, "noop", {"n": 4}, dedupe_key="order-7")              # finished: new job
    assert second not in (first, other_kind)
    assert enqueue(conn, "noop", dedupe_key="order-7") == second

    finish(conn, second, "cancelled")
    third = enqueue(conn, "noop", dedupe_key="order-7")
    assert third not in (first, second, other_kind)
    assert count_jobs(conn) == 4
    assert [r[0] for r in conn.execute(
        "SELECT status FROM pgfence.all_jobs WHERE kind = 'noop' AND dedupe_key = 'order-7' ORDER BY id")] == \
        ["done", "cancelled", "queued"]


def test_concurrent_enqueues_with_one_dedupe_key_make_one_job(dsn, conn):
    threads = 8
    barrier = threading.Barrier(threads)
    ids: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SET statement_timeout = '10s'")
                barrier.wait()
                ids.append(enqueue(c, "noop", dedupe_key="burst"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=30)
    assert errors == []
    assert len(ids) == threads and len(set(ids)) == 1
    assert count_jobs(conn) == 1


def test_idempotency_key_comes_from_the_id_never_the_attempt(conn, make_worker):
    assert idempotency_key(42) == "pgfence:job:42"

    plain = enqueue(conn, "noop")
    worker = make_worker("w-key", lease=0.2)
    [one] = worker.claim()
    wait_for(lambda: scalar(conn, "SELECT lease_until < now() FROM pgfence.all_jobs WHERE id = %s", (plain,)),
             timeout=10, message="the lease to expire")
    [two] = worker.claim()
    assert (one.id, one.attempt, two.id, two.attempt) == (plain, 1, plain, 2)
    assert one.idempotency_key == two.idempotency_key == f"pgfence:job:{plain}"

    # Two jobs with one dedupe key (the first finished): a key each, and
    # the opt-in dedupe-key form shared.
    with two.fenced():
        pass
    a = enqueue(conn, "noop", dedupe_key="evt-1")
    [ja] = worker.claim()
    with ja.fenced():
        pass
    b = enqueue(conn, "noop", dedupe_key="evt-1")
    [jb] = worker.claim()
    assert a != b and (ja.id, jb.id) == (a, b)
    assert (ja.idempotency_key, jb.idempotency_key) == (f"pgfence:job:{a}", f"pgfence:job:{b}")
    assert ja.dedupe_idempotency_key == jb.dedupe_idempotency_key == "pgfence:dedupe:noop:evt-1"


def test_enqueue_rolls_back_with_the_callers_transaction(dsn, conn):
    conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn, autocommit=True) as other:
        listener.execute("LISTEN pgfence_jobs")
        with pytest.raises(RuntimeError, match="payment declined"):
            with conn.transaction():
                conn.execute("INSERT INTO public.orders VALUES (1)")
                job_id = enqueue(conn, "noop", {"order": 1}, queue="q_rolled_back")
                assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE id = %s", (job_id,)) == 1
                assert count_jobs(other) == 0            # not visible before commit
                raise RuntimeError("payment declined")
        assert count_jobs(conn) == 0
        assert scalar(conn, "SELECT count(*) FROM public.orders") == 0

        with conn.transaction():
            conn.execute("INSERT INTO public.orders VALUES (2)")
            kept = enqueue(conn, "noop", {"order": 2}, queue="q_committed")
        assert [r[0] for r in conn.execute("SELECT id FROM pgfence.all_jobs")] == [kept]
        assert scalar(conn, "SELECT count(*) FROM public.orders") == 1
        # The rolled-back enqueue never notified; the first wake-up is the commit's.
        notes = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in notes] == [("pgfence_jobs", "q_committed")]


def test_sql_function_enqueue_with_defaults_and_all_arguments(conn):
    job_id = scalar(conn, "SELECT pgfence.enqueue('noop')")
    row = job_row(conn, job_id)
    assert {k: row[k] for k in ("kind", "queue", "payload", "status", "attempt", "max_attempts", "reclaims",
                                "max_reclaims", "priority", "dedupe_key", "locked_by", "lease_until",
                                "last_error", "started_at", "finished_at")} == {
        "kind": "noop", "queue": "default", "payload": {}, "status": "queued", "attempt": 0, "max_attempts": 5,
        "reclaims": 0, "max_reclaims": 3, "priority": 0, "dedupe_key": None, "locked_by": None,
        "lease_until": None, "last_error": None, "started_at": None, "finished_at": None}
    assert row["run_at"] == row["created_at"]

    with conn.transaction():
        full = scalar(conn, """
            SELECT pgfence.enqueue(p_kind => 'report', p_payload => '{"a": [1, 2]}'::jsonb,
                                   p_queue => 'reports', p_priority => 7,
                                   p_run_at => '2031-05-06 07:08:09.5+00', p_max_attempts => 2,
                                   p_dedupe_key => 'r-1', p_max_reclaims => 0)""")
        # Same key while queued: the same id, from plain SQL too.
        assert scalar(conn, "SELECT pgfence.enqueue('report', p_dedupe_key => 'r-1')") == full
    row = job_row(conn, full)
    assert (row["kind"], row["payload"], row["queue"], row["priority"], row["max_attempts"],
            row["dedupe_key"], row["max_reclaims"], row["status"]) == \
        ("report", {"a": [1, 2]}, "reports", 7, 2, "r-1", 0, "queued")
    assert row["run_at"] == dt.datetime(2031, 5, 6, 7, 8, 9, 500000, tzinfo=UTC)
    # NULL arguments fall back to the defaults, like omitted ones.
    nulls = scalar(conn, "SELECT pgfence.enqueue('noop', NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    row = job_row(conn, nulls)
    assert (row["payload"], row["queue"], row["priority"], row["max_attempts"], row["max_reclaims"]) == \
        ({}, "default", 0, 5, 3)
    assert count_jobs(conn) == 3


def test_python_enqueue_uses_handler_defaults_and_validates(conn):
    @handler("t_defaults", queue="mail", max_attempts=9, max_reclaims=1)
    def defaults(job):
        pass

    job_id = enqueue(conn, "t_defaults")
    row = job_row(conn, job_id)
    assert (row["queue"], row["max_attempts"], row["max_reclaims"]) == ("mail", 9, 1)
    explicit = enqueue(conn, "t_defaults", queue="other", max_attempts=2, max_reclaims=0)
    row = job_row(conn, explicit)
    assert (row["queue"], row["max_attempts"], row["max_reclaims"]) == ("other", 2, 0)

    for kwargs, message in [
        ({"delay": -1}, "invalid delay"),
        ({"max_attempts": 0}, "invalid max-attempts"),
        ({"max_reclaims": -1}, "invalid max-reclaims"),
        ({"priority": 2**31}, "invalid priority: must be between -2147483648 and 2147483647"),
        ({"priority": -(2**31) - 1}, "invalid priority"),
        ({"max_reclaims": 2**40}, "invalid max-reclaims"),
        ({"delay": 1, "run_at": dt.datetime.now(UTC)}, "not both"),
        ({"payload": {"x": float("nan")}}, "not JSON-serialisable"),
        ({"payload": {"x": object()}}, "not JSON-serialisable"),
    ]:
        payload = kwargs.pop("payload", None)
        with pytest.raises(ConfigError, match=message):
            enqueue(conn, "noop", payload, **kwargs)
    assert count_jobs(conn) == 2
    # The int4 bounds themselves are accepted.
    low, high = enqueue(conn, "noop", priority=-(2**31)), enqueue(conn, "noop", priority=2**31 - 1)
    assert (job_row(conn, low)["priority"], job_row(conn, high)["priority"]) == (-(2**31), 2**31 - 1)


COLUMNS = ("kind", "queue", "payload", "status", "attempt", "max_attempts", "reclaims", "max_reclaims",
           "priority", "dedupe_key", "locked_by", "lease_until", "last_error", "started_at", "finished_at")


def columns(row: dict) -> dict:
    return {k: row[k] for k in COLUMNS}


def test_cli_enqueue_options_set_the_row_exactly(dsn, conn):
    out = pgfence("enqueue", "noop", "--payload", '{"x": [1, 2], "s": "\u00e9"}', "--queue", "mail",
                  "--priority", "7", "--max-attempts", "2", "--max-reclaims", "4", "--dedupe-key", "k1",
                  "--delay", "90", dsn=dsn)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout)
    assert out.stdout == f"{job_id}\n"
    row = job_row(conn, job_id)
    assert columns(row) == {
        "kind": "noop", "queue": "mail", "payload": {"x": [1, 2], "s": "\u00e9"}, "status": "queued",
        "attempt": 0, "max_attempts": 2, "reclaims": 0, "max_reclaims": 4, "priority": 7, "dedupe_key": "k1",
        "locked_by": None, "lease_until": None, "last_error": None, "started_at": None, "finished_at": None}
    # --delay counts from the enqueue (computed on the client's clock, just before the insert).
    delay = (row["run_at"] - row["created_at"]).total_seconds()
    assert 89.0 <= delay <= 90.0, delay

    out = pgfence("enqueue", "noop", "--run-at", "2031-05-06T07:08:09+02:00", "--priority", "-3", dsn=dsn)
    assert out.returncode == 0, out.stderr
    row = job_row(conn, int(out.stdout))
    assert row["run_at"] == dt.datetime(2031, 5, 6, 5, 8, 9, tzinfo=UTC)
    assert (row["priority"], row["queue"], row["max_attempts"], row["max_reclaims"], row["payload"]) == \
        (-3, "default", 5, 3, {})

    out = pgfence("enqueue", "noop", dsn=dsn)
    assert out.returncode == 0, out.stderr
    row = job_row(conn, int(out.stdout))
    assert columns(row) == {
        "kind": "noop", "queue": "default", "payload": {}, "status": "queued", "attempt": 0, "max_attempts": 5,
        "reclaims": 0, "max_reclaims": 3, "priority": 0, "dedupe_key": None, "locked_by": None,
        "lease_until": None, "last_error": None, "started_at": None, "finished_at": None}
    assert row["run_at"] == row["created_at"]

    # A kind no local handler defines is refused unless --any-kind says a worker elsewhere knows it.
    refused = pgfence("enqueue", "remote_kind", dsn=dsn)
    assert refused.returncode == 2 and refused.stderr.startswith("pgfence: error: unknown job kind 'remote_kind'")
    out = pgfence("enqueue", "remote_kind", "--any-kind", "--run-at", "2031-01-01T00:00:00", dsn=dsn)
    assert out.returncode == 0, out.stderr
    row = job_row(conn, int(out.stdout))
    assert row["kind"] == "remote_kind"
    # A naive --run-at is local time.
    assert row["run_at"] == dt.datetime(2031, 1, 1).astimezone()
    assert count_jobs(conn) == 4

    dup = pgfence("enqueue", "noop", "--dedupe-key", "k1", "--payload", '{"other": true}', dsn=dsn)
    assert dup.returncode == 0, dup.stderr
    assert int(dup.stdout) == job_id and count_jobs(conn) == 4
    assert job_row(conn, job_id)["payload"] == {"x": [1, 2], "s": "\u00e9"}   # the first enqueue's


# -- aenqueue: the same on a psycopg.AsyncConnection --------------------------------------


def arun(dsn: str, body):
    """Run ``body(aconn)`` on a fresh async connection (not autocommit,
    as an application's would be), in an event loop of its own."""
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            return await body(aconn)

    return asyncio.run(main())


def test_aenqueue_writes_the_row_enqueue_writes_and_commits_or_rolls_back_with_the_caller(dsn, conn):
    conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
    options = {"queue": "mail", "priority": 3, "max_attempts": 2, "max_reclaims": 1, "dedupe_key": "o-1"}
    sync_id = enqueue(conn, "noop", {"order": 1}, **options)

    async def both(aconn):
        async with aconn.transaction():
            await aconn.execute("INSERT INTO public.orders VALUES (1)")
            job_id = await aenqueue(aconn, "noop", {"order": 2}, **{**options, "dedupe_key": "o-2"})
        with pytest.raises(RuntimeError, match="declined"):
            async with aconn.transaction():
                await aconn.execute("INSERT INTO public.orders VALUES (2)")
                await aenqueue(aconn, "noop", {"order": 3}, queue="rolled_back")
                raise RuntimeError("declined")
        # A live job's dedupe key returns its id, as enqueue does.
        again = await aenqueue(aconn, "noop", {"order": 9}, dedupe_key="o-1")
        await aconn.commit()
        return job_id, again

    async_id, again = arun(dsn, both)
    assert again == sync_id
    sync_row, async_row = columns(job_row(conn, sync_id)), columns(job_row(conn, async_id))
    assert async_row == {**sync_row, "payload": {"order": 2}, "dedupe_key": "o-2"}
    assert (async_row["queue"], async_row["priority"], async_row["max_attempts"], async_row["max_reclaims"],
            async_row["status"]) == ("mail", 3, 2, 1, "queued")
    assert [r[0] for r in conn.execute("SELECT id FROM public.orders")] == [1]
    assert [r[0] for r in conn.execute("SELECT id FROM pgfence.all_jobs ORDER BY id")] == [sync_id, async_id]


def test_aenqueue_applies_the_handlers_options_and_refuses_bad_input_before_writing(dsn, conn):
    @handler("t_async_defaults", queue="reports", max_attempts=7, max_reclaims=0)
    async def defaults(job):
        pass

    async def bad(aconn):
        messages = []
        for kwargs in ({"delay": -1}, {"max_attempts": 0}, {"priority": 2**31},
                       {"payload": {"x": float("nan")}}, {"queue": "no spaces"}, {"kind": ""}):
            kind, payload = kwargs.pop("kind", "noop"), kwargs.pop("payload", None)
            with pytest.raises(ConfigError) as caught:
                await aenqueue(aconn, kind, payload, **kwargs)
            messages.append(str(caught.value).split(":")[0])
        job_id = await aenqueue(aconn, "t_async_defaults")
        await aconn.commit()
        return messages, job_id

    messages, job_id = arun(dsn, bad)
    assert messages == ["invalid delay", "invalid max-attempts", "invalid priority",
                        "payload is not JSON-serialisable", "invalid queue name 'no spaces'", "invalid kind name ''"]
    row = job_row(conn, job_id)
    assert (row["queue"], row["max_attempts"], row["max_reclaims"]) == ("reports", 7, 0)
    assert count_jobs(conn) == 1


def test_aenqueue_on_a_broken_connection_raises_pgfence_errors(dsn, conn):
    async def gone(aconn):
        pid = (await (await aconn.execute("SELECT pg_backend_pid()")).fetchone())[0]
        await aconn.commit()
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await aenqueue(aconn, "noop")

    with pytest.raises(DatabaseError) as caught:
        arun(dsn, gone)
    assert not isinstance(caught.value, psycopg.Error)
    assert count_jobs(conn) == 0


# -- enqueue_many: many jobs in one statement ---------------------------------------------


def test_enqueue_many_returns_ids_in_order_with_every_option_and_the_dedupe_keys_honoured(conn):
    @handler("t_many_defaults", queue="reports", max_attempts=7, max_reclaims=0)
    def defaults(job):
        pass

    held = enqueue(conn, "noop", {"first": True}, dedupe_key="k-held")
    conn.execute("INSERT INTO pgfence.kinds (kind, queue, max_attempts, max_reclaims) "
                 "VALUES ('t_many_recorded', 'recorded', 4, 2)")
    run_at = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    ids = enqueue_many(conn, [
        {"kind": "noop", "payload": {"n": 0}},
        {"kind": "noop", "payload": {"n": 1}, "dedupe_key": "k-held"},          # held by a live job
        {"kind": "report", "payload": {"n": 2}, "queue": "mail", "priority": 4, "run_at": run_at,
         "max_attempts": 2, "max_reclaims": 1, "dedupe_key": "k-new"},
        {"kind": "report", "payload": {"n": 3}, "dedupe_key": "k-new"},          # held by job 2 of this call
        {"kind": "t_many_defaults", "delay": 30},
        {"kind": "noop"},
        {"kind": "t_many_recorded"},                          # options a worker recorded in pgfence.kinds
        {"kind": "t_many_recorded", "queue": "mine", "max_attempts": 1},
    ])
    assert ids[1] == held and ids[3] == ids[2]
    new = [ids[0], ids[2], ids[4], ids[5], ids[6], ids[7]]
    assert new == sorted(new) and len(set(new)) == 6 and new[0] > held
    rows = {r["id"]: r for r in map(lambda i: job_row(conn, i), new)}
    assert [(rows[i]["kind"], rows[i]["payload"], rows[i]["queue"], rows[i]["priority"], rows[i]["max_attempts"],
             rows[i]["max_reclaims"], rows[i]["dedupe_key"], rows[i]["status"], rows[i]["attempt"]) for i in new] == [
        ("noop", {"n": 0}, "default", 0, 5, 3, None, "queued", 0),
        ("report", {"n": 2}, "mail", 4, 2, 1, "k-new", "queued", 0),
        ("t_many_defaults", {}, "reports", 0, 7, 0, None, "queued", 0),
        ("noop", {}, "default", 0, 5, 3, None, "queued", 0),
        ("t_many_recorded", {}, "recorded", 0, 4, 2, None, "queued", 0),
        ("t_many_recorded", {}, "mine", 0, 1, 2, None, "queued", 0),
    ]
    assert rows[ids[2]]["run_at"] == run_at
    assert rows[ids[4]]["run_at"] - rows[ids[4]]["created_at"] == dt.timedelta(seconds=30)
    assert rows[ids[0]]["run_at"] == rows[ids[0]]["created_at"]
    assert job_row(conn, held)["payload"] == {"first": True}
    assert count_jobs(conn) == 7
    assert enqueue_many(conn, []) == []
    assert count_jobs(conn) == 7


def test_enqueue_many_of_more_than_one_statement_keeps_the_order_and_commits_or_rolls_back_whole(dsn, conn):
    n = 25_000   # three statements of client.MANY_CHUNK
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgfence_jobs")
        with pytest.raises(RuntimeError, match="stop"):
            with conn.transaction():
                enqueue_many(conn, [{"kind": "noop", "payload": {"i": i}, "queue": "gone"} for i in range(n)])
                raise RuntimeError("stop")
        assert count_jobs(conn) == 0
        with conn.transaction():
            ids = enqueue_many(conn, ({"kind": "noop", "payload": {"i": i}, "queue": f"q{i % 2}"} for i in range(n)))
        assert len(ids) == n and ids == sorted(ids) and len(set(ids)) == n
        got = conn.execute("SELECT id, (payload->>'i')::int, queue FROM pgfence.jobs ORDER BY id").fetchall()
        assert got == [(job_id, i, f"q{i % 2}") for i, job_id in enumerate(ids)]
        # One notification per queue, on commit; none of the rolled-back ones.
        notes = sorted(n.payload for n in listener.notifies(timeout=5, stop_after=2))
        assert notes == ["q0", "q1"]


def test_enqueue_many_refuses_bad_input_naming_the_job_and_writes_nothing(conn):
    good = {"kind": "noop", "payload": {"ok": 1}}
    for job, message in [
        ({"kind": "noop", "delay": -1}, "job 1: invalid delay: must be 0 or more seconds, got -1"),
        ({"kind": "noop", "payload": {"x": float("nan")}}, "job 1: payload is not JSON-serialisable"),
        ({"kind": "noop", "payload": {"s": "a\x00b"}}, "job 1: invalid payload: a string holds a NUL"),
        ({"kind": "bad kind"}, "job 1: invalid kind name 'bad kind'"),
        ({"kind": "noop", "queue": "bad queue"}, "job 1: invalid queue name 'bad queue'"),
        ({"kind": "noop", "priority": "high"}, "job 1: invalid priority: must be a whole number, got 'high'"),
        ({"kind": "noop", "priority": 2**31}, "job 1: invalid priority: must be between"),
        ({"kind": "noop", "max_attempts": 0}, "job 1: invalid max-attempts"),
        ({"kind": "noop", "run_at": "tomorrow"}, "job 1: invalid run_at: must be a datetime, got 'tomorrow'"),
        ({"kind": "noop", "delay": "5"}, "job 1: invalid delay: must be a number of seconds, got '5'"),
        ({"kind": "noop", "delay": 1, "run_at": dt.datetime.now(UTC)}, "job 1: give delay or run_at, not both"),
        ({"kind": "noop", "dedupe_key": 5}, "job 1: invalid dedupe key: must be a string, got 5"),
        ({"kind": "noop", "dedupe_key": "pgfence:periodic:x"}, "job 1: invalid dedupe key"),
        ({"kind": "noop", "qeueu": "mail"}, "job 1: unknown field(s): qeueu"),
        ({"payload": {}}, "job 1: no kind"),
        (("noop", {}), "job 1: must be a mapping of enqueue's arguments, got tuple"),
    ]:
        with pytest.raises(ConfigError) as caught:
            enqueue_many(conn, [good, job, good])
        assert str(caught.value).startswith(message), (job, str(caught.value))
    assert count_jobs(conn) == 0


def test_enqueue_many_returns_the_holder_another_transaction_committed_while_it_waited(dsn, conn):
    """The holder of a dedupe key commits while enqueue_many's statement
    waits on it: the statement's snapshot does not show it, so that job is
    enqueued again on its own and gets the holder's id, as enqueue() would."""
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as producer:
        held = enqueue(holder, "noop", {"holder": True}, dedupe_key="k-race")     # not committed yet
        pid = scalar(producer, "SELECT pg_backend_pid()")
        producer.commit()
        got: list = []
        thread = threading.Thread(target=lambda: got.append(enqueue_many(producer, [
            {"kind": "noop", "payload": {"n": 0}}, {"kind": "noop", "payload": {"n": 1}, "dedupe_key": "k-race"}])))
        thread.start()
        assert wait_for(lambda: scalar(conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                       (pid,)) == "Lock", timeout=10)
        holder.commit()
        thread.join(timeout=10)
        producer.commit()
    [ids] = got
    assert ids[1] == held
    assert conn.execute("SELECT id, payload, dedupe_key FROM pgfence.jobs ORDER BY id").fetchall() == [
        (held, {"holder": True}, "k-race"), (ids[0], {"n": 0}, None)]


def test_enqueue_many_of_jobs_alike_but_their_payloads_applies_the_kinds_options_and_keeps_the_order(conn):
    # One kind, one set of options, no run_at nor dedupe key: the narrower
    # statement (enqueue_many_alike) of the store.
    conn.execute("INSERT INTO pgfence.kinds (kind, queue, max_attempts, max_reclaims) "
                 "VALUES ('t_alike', 'alike', 6, 1)")
    ids = enqueue_many(conn, [{"kind": "t_alike", "payload": {"n": n}} for n in range(5)])
    assert ids == list(range(ids[0], ids[0] + 5))
    rows = [job_row(conn, i) for i in ids]
    assert [(r["kind"], r["payload"], r["queue"], r["priority"], r["max_attempts"], r["max_reclaims"],
             r["dedupe_key"], r["status"]) for r in rows] == [
        ("t_alike", {"n": n}, "alike", 0, 6, 1, None, "queued") for n in range(5)]
    assert all(r["run_at"] == r["created_at"] for r in rows)
    # The same options given, and a delay: still one statement's values.
    later = enqueue_many(conn, [{"kind": "t_alike", "payload": [n], "queue": "q2", "priority": 3, "delay": 60,
                                 "max_attempts": 2, "max_reclaims": 0} for n in range(3)])
    rows = [job_row(conn, i) for i in later]
    assert [(r["payload"], r["queue"], r["priority"], r["max_attempts"], r["max_reclaims"]) for r in rows] == [
        ([n], "q2", 3, 2, 0) for n in range(3)]
    assert all(r["run_at"] - r["created_at"] == dt.timedelta(seconds=60) for r in rows)
    assert count_jobs(conn) == 8


@pytest.mark.parametrize("alike", [True, False])
def test_enqueue_many_returns_ids_that_are_not_consecutive_in_the_order_given(conn, alike):
    # Another producer's nextval between two of ours leaves gaps; a sequence
    # that steps by 3 makes every id of the call a gap away from the next.
    conn.execute("ALTER SEQUENCE pgfence.jobs_id_seq INCREMENT BY 3")
    jobs = [{"kind": "noop", "payload": {"n": n}, **({} if alike else {"priority": n})} for n in range(4)]
    ids = enqueue_many(conn, jobs)
    assert [b - a for a, b in zip(ids, ids[1:])] == [3, 3, 3]
    assert [(job_row(conn, i)["payload"], job_row(conn, i)["priority"]) for i in ids] == [
        ({"n": n}, 0 if alike else n) for n in range(4)]
