"""Loading handler modules: async generators refused, handlers whose queue no
worker serves, and modules imported from the current directory."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from pgtools import ROOT, env_for, job_row, pgfence, scalar, spawn, wait_for
from pgfence import ConfigError, enqueue, handler, registry
from pgfence.worker.outcomes import FAILED

ASYNC_REFUSED = ("pgfence: error: handler 't_async' (amod.agen) is an async generator; calling it runs nothing: "
                 "define it with async def and no yield, or with def\n")


def env_with(dsn: str, folder: Path, **extra: str) -> dict[str, str]:
    """env_for(dsn) with ``folder`` (the test's handler modules) on PYTHONPATH."""
    env = env_for(dsn, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    return env


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of a process expected to exit by
    itself; killed at the deadline (exit -9) if it does not."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out, err, proc.returncode


# -- async handlers ---------------------------------------------------------------


async def _coro(job):
    pass


async def _agen(job):
    yield job


def _sync(job):
    pass


class _AsyncCall:
    async def __call__(self, job):
        pass


class _SyncCall:
    def __call__(self, job):
        pass


@functools.wraps(_coro)
def _sync_wrapper_of_async(job):
    """A synchronous handler that runs async code itself: allowed."""
    asyncio.run(_coro(job))


@pytest.mark.parametrize(("func", "expected"), [
    (_coro, True),
    (_agen, True),
    (functools.partial(_coro), True),
    (functools.partial(functools.partial(_coro)), True),
    (_AsyncCall(), True),
    (functools.partial(_AsyncCall()), True),
    (_sync, False),
    (functools.partial(_sync), False),
    (_SyncCall(), False),
    (_sync_wrapper_of_async, False),
    (lambda job: None, False),
    (_AsyncCall, False),       # calling the class makes an instance, it runs nothing
    (len, False),
], ids=["async_def", "async_generator", "partial", "partial_of_partial", "async_call", "partial_of_async_call",
        "def", "partial_of_def", "sync_call", "sync_wrapper", "lambda", "class", "builtin"])
def test_is_async_recognises_what_would_never_run(func, expected):
    assert registry.is_async(func) is expected


def test_async_handlers_are_registered_as_async_and_async_generators_refused_with_one_line():
    for func in (_coro, functools.partial(_coro), _AsyncCall()):
        assert handler("t_async_ok")(func) is func
        assert registry.get("t_async_ok").is_async is True
    for func in (_agen, functools.partial(_agen)):
        with pytest.raises(ConfigError) as info:
            handler("t_refused")(func)
        assert str(info.value) == (
            f"handler 't_refused' ({__name__}._agen) is an async generator; calling it runs nothing: define it "
            "with async def and no yield, or with def")
        assert registry.find("t_refused") is None
    assert handler("t_accepted")(_sync_wrapper_of_async) is _sync_wrapper_of_async
    assert registry.get("t_accepted").func is _sync_wrapper_of_async
    assert registry.get("t_accepted").is_async is False


def test_an_async_generator_handler_module_stops_run_and_work_with_one_line(dsn, conn, tmp_path):
    (tmp_path / "amod.py").write_text(textwrap.dedent("""
        from pgfence import handler

        @handler("t_async")
        async def agen(job):
            yield job
    """))
    env = env_with(dsn, tmp_path)
    procs = [spawn("run", "--handlers", "amod", env=env), spawn("work", "--burst", "--handlers", "amod", env=env),
             spawn("enqueue", "t_async", "--handlers", "amod", env=env)]
    results = [finish(p) for p in procs]
    assert results == [("", ASYNC_REFUSED, 2)] * 3
    # Nothing was written: no kind registered, no job.
    assert scalar(conn, "SELECT count(*) FROM pgfence.kinds") == 0
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0


def test_a_handler_that_returns_an_awaitable_fails_its_job_instead_of_completing_it(conn, make_worker):
    ran = []

    async def work(job):
        ran.append(job.id)

    # A plain function that hands back a coroutine gets past the registry.
    handler("t_returns_coro")(lambda job: work(job))
    job_id = enqueue(conn, "t_returns_coro", {"n": 1})
    worker = make_worker("w-await")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert worker.run_once() == 1
        gc.collect()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt"], row["last_error"]) == (
        "failed", 1, "handler returned an awaitable (coroutine) instead of running: "
                     "a def handler runs on a thread and nothing awaits what it returns; make it async def")
    assert row["finished_at"] is not None
    assert worker.stats.outcomes == {FAILED: 1}
    assert ran == []
    # The coroutine was closed, not left to warn that it was never awaited.
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


# -- queues no worker serves ------------------------------------------------------


def test_unserved_lists_handlers_whose_queue_is_not_served():
    handler("t_q_mail", queue="mail")(_sync)
    handler("t_q_reports", queue="reports")(_sync)
    handler("t_q_none")(_sync)
    unserved = {s.kind: s.queue for s in registry.unserved(["mail"]) if s.kind.startswith("t_q_")}
    assert unserved == {"t_q_reports": "reports", "t_q_none": None}
    assert [s.kind for s in registry.unserved(["mail", "reports", "default"]) if s.kind.startswith("t_q_")] == []


QUEUES_MODULE = """
from pgfence import handler

@handler("t_mail", queue="mail")
def mail(job):
    pass

@handler("t_reports", queue="reports")
def reports(job):
    pass

@handler("t_plain")
def plain(job):
    pass
"""


def warnings_of(stderr: str) -> list[str]:
    """The WARNING lines of a log, without their time stamps."""
    return [line.split(" WARNING ", 1)[1] for line in stderr.splitlines() if " WARNING " in line]


def test_run_and_work_warn_about_each_handler_whose_queue_they_do_not_serve(dsn, conn, tmp_path):
    (tmp_path / "qmod.py").write_text(QUEUES_MODULE)
    env = env_with(dsn, tmp_path)
    expected = [
        "pgfence: handler 't_plain' puts its jobs on queue 'default', which this worker does not serve "
        "(queues: mail,other)",
        "pgfence: handler 't_reports' puts its jobs on queue 'reports', which this worker does not serve "
        "(queues: mail,other)",
    ]
    work = pgfence("work", "--burst", "--queues", "mail,other", "--handlers", "qmod", env=env)
    assert work.returncode == 0, work.stderr
    assert warnings_of(work.stderr) == expected

    run = spawn("run", "--workers", "1", "--queues", "mail,other", "--handlers", "qmod", env=env)
    try:
        # A worker connected: the arbiter is in its loop, long past its start.
        wait_for(lambda: scalar(conn, """
            SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name LIKE 'pgfence worker %'"""),
                 timeout=30, message="a worker of the run connected")
    finally:
        run.send_signal(signal.SIGTERM)
        _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert warnings_of(err) == expected

    served = pgfence("work", "--burst", "--queues", "mail,reports,default", "--handlers", "qmod", env=env)
    assert served.returncode == 0, served.stderr
    assert warnings_of(served.stderr) == []


# -- modules from the current directory -------------------------------------------


def pgfence_in(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run pgfence with ``folder`` as its current directory, as the installed
    console script runs: ``-P`` keeps ``python -m`` from putting the current
    directory on sys.path itself, which the console script never does."""
    return subprocess.run([sys.executable, "-P", "-m", "pgfence", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)


def test_handler_modules_are_imported_from_the_current_directory(dsn, conn, tmp_path):
    (tmp_path / "myjobs.py").write_text(textwrap.dedent("""
        from pathlib import Path

        from pgfence import handler

        @handler("t_cwd")
        def cwd_job(job):
            Path(f"ran-{job.id}-{job.attempt}").write_text(job.payload["word"])
    """))
    env = env_for(dsn)   # ROOT and tests/ on PYTHONPATH, tmp_path not
    assert str(tmp_path) not in env["PYTHONPATH"] and Path.cwd() != tmp_path

    out = pgfence_in(tmp_path, "enqueue", "t_cwd", "--payload", '{"word": "here"}', "--handlers", "myjobs", env=env)
    assert (out.returncode, out.stderr) == (0, "")
    job_id = int(out.stdout)
    work = pgfence_in(tmp_path, "work", "--burst", "--handlers", "myjobs", env=env)
    assert work.returncode == 0, work.stderr
    row = job_row(conn, job_id)
    assert (row["kind"], row["status"], row["attempt"], row["last_error"]) == ("t_cwd", "done", 1, None)
    assert (tmp_path / f"ran-{job_id}-1").read_text() == "here"

    # From another directory the module is not found: one line, exit 2.
    elsewhere = pgfence_in(ROOT, "work", "--burst", "--handlers", "myjobs", env=env)
    assert (elsewhere.returncode, elsewhere.stdout) == (2, "")
    assert elsewhere.stderr == ("pgfence: error: cannot import handler module 'myjobs': "
                                "ModuleNotFoundError: No module named 'myjobs'\n")
