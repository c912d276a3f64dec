"""``--metrics-dir`` wipes only a directory of pgfence's own: one it created
or an empty one it took, marked by its marker file.  A directory holding
anything else (a user's SQLite database) is refused, and nothing is deleted."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pgtools import env_for, pgfence
from supervisors import supervisors  # noqa: F401 - the fixture
from pgfence.observe import multiproc
from pgfence.errors import ConfigError


def users_database(path) -> bytes:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (name TEXT)")
        db.execute("INSERT INTO customers VALUES ('Ada')")
    db.close()
    return path.read_bytes()


def test_a_directory_with_a_users_file_is_refused_and_kept_whole(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    before = users_database(directory / "customers.db")
    (directory / "counter_811.db").write_bytes(b"not pgfence's either")
    with pytest.raises(ConfigError) as info:
        multiproc.claim_dir(directory)
    assert str(info.value) == (
        f"invalid metrics-dir {str(directory)!r}: it holds files pgfence did not create (counter_811.db, "
        "customers.db), and pgfence deletes the files of its metrics directory at each start; "
        "give a new or empty directory")
    assert sorted(p.name for p in directory.iterdir()) == ["counter_811.db", "customers.db"]
    assert (directory / "customers.db").read_bytes() == before


def test_a_new_or_empty_directory_is_marked_and_only_metric_files_are_wiped(tmp_path):
    new = tmp_path / "a" / "metrics"
    assert multiproc.claim_dir(new) == []
    assert sorted(p.name for p in new.iterdir()) == [multiproc.MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert multiproc.claim_dir(empty) == []
    assert sorted(p.name for p in empty.iterdir()) == [multiproc.MARKER]
    # A run left its files; someone later dropped a file of their own there.
    stale = ["counter_12.db", "gauge_livesum_13.db", "gauge_all_14.db", "histogram_12.db", "summary_9.db"]
    for name in stale:
        (new / name).write_bytes(b"x")
    before = users_database(new / "customers.db")
    (new / "notes.txt").write_text("mine")
    deleted = multiproc.claim_dir(new)
    assert sorted(p.name for p in deleted) == sorted(stale)
    assert sorted(p.name for p in new.iterdir()) == [multiproc.MARKER, "customers.db", "notes.txt"]
    assert (new / "customers.db").read_bytes() == before


@pytest.mark.parametrize("source", ["flag", "env"])
def test_pgfence_run_refuses_a_users_directory_with_one_line(dsn, tmp_path, source):
    directory = tmp_path / "app"
    directory.mkdir()
    before = users_database(directory / "customers.db")
    if source == "flag":
        result = pgfence("run", "--workers", "1", "--metrics-dir", str(directory), env=env_for(dsn))
    else:
        result = pgfence("run", "--workers", "1", env=env_for(dsn, PGFENCE_METRICS_DIR=str(directory)))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"pgfence: error: invalid metrics-dir {str(directory)!r}: it holds files pgfence did not create "
        "(customers.db), and pgfence deletes the files of its metrics directory at each start; "
        "give a new or empty directory"]
    assert [p.name for p in directory.iterdir()] == ["customers.db"]
    assert (directory / "customers.db").read_bytes() == before


# -- the temp folders of runs killed before they could delete theirs -----------------


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def made_folder(parent: Path, name: str, owner: str | None, files: tuple[str, ...] = ("counter_7.db",)) -> Path:
    folder = parent / f"{multiproc.PREFIX}{name}"
    folder.mkdir()
    (folder / multiproc.MARKER).write_text("marker")
    if owner is not None:
        (folder / multiproc.OWNER).write_text(owner)
    for file in files:
        (folder / file).write_bytes(b"x")
    return folder


def test_the_sweep_deletes_only_folders_whose_arbiter_is_gone(tmp_path):
    host = socket.gethostname()
    gone = made_folder(tmp_path, "gone", f"{host} {dead_pid()} 123\n", ("counter_7.db", "gauge_livesum_7.db"))
    never_read = made_folder(tmp_path, "gone-unread", f"{host} {dead_pid()} -\n", ())
    live = made_folder(tmp_path, "live", multiproc.owner_line(os.getpid()))
    reused = made_folder(tmp_path, "reused", f"{host} {os.getpid()} 1\n")   # its pid is another process now
    elsewhere = made_folder(tmp_path, "elsewhere", f"{host}-other {dead_pid()} 123\n")
    unowned = made_folder(tmp_path, "unowned", None)
    foreign = made_folder(tmp_path, "foreign", f"{host} {dead_pid()} 123\n", ("counter_7.db", "notes.txt"))
    unmarked = tmp_path / f"{multiproc.PREFIX}unmarked"
    unmarked.mkdir()
    (unmarked / multiproc.OWNER).write_text(f"{host} {dead_pid()} 123\n")
    garbled = made_folder(tmp_path, "garbled", "not an owner line")
    other_name = tmp_path / "metrics-elsewhere"
    other_name.mkdir()
    assert multiproc.sweep(tmp_path) == sorted([gone, never_read, reused])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (live, elsewhere, unowned, foreign, unmarked, garbled, other_name))
    assert sorted(p.name for p in foreign.iterdir()) == [multiproc.MARKER, multiproc.OWNER, "counter_7.db",
                                                         "notes.txt"]
    assert multiproc.sweep(tmp_path) == []


def test_a_run_sweeps_the_folder_a_sigkilled_supervisor_left_and_no_live_ones(dsn, tmp_path, supervisors):
    """Two supervisors with their own temp metrics folders; one is SIGKILLed
    and leaves its folder.  The next supervisor's start deletes it (saying
    so) and leaves the live one's; clean stops delete their own."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}

    def folders() -> dict[str, str]:
        return {p.name: (p / multiproc.OWNER).read_text().split()[1] for p in temp.iterdir()}

    killed = supervisors(env=env, workers=1)
    kept = supervisors(env=env, workers=1)
    for sup in (killed, kept):
        sup.wait_workers(1)
    made = folders()
    assert sorted(made.values()) == sorted([str(killed.pid), str(kept.pid)])
    killed_folder = next(name for name, pid in made.items() if pid == str(killed.pid))
    killed.children()
    killed.signal(signal.SIGKILL)
    assert killed.wait_exit(10) == -signal.SIGKILL
    killed.wait(lambda: not any(killed.alive(pid) for pid in killed.seen), 20, "the killed run's children gone")
    assert killed_folder in folders()

    third = supervisors(env=env, workers=1)
    third.wait_workers(1)
    now = folders()
    assert sorted(now.values()) == sorted([str(kept.pid), str(third.pid)])
    assert killed_folder not in now
    assert f"deleted 1 metrics folder(s) of supervisors that are gone: {killed_folder}" in third.log()
    assert "deleted" not in kept.log()
    assert kept.stop() == 0 and third.stop() == 0
    assert folders() == {}


def test_a_run_refused_for_bad_input_leaves_no_folder_and_sweeps_nothing(dsn, tmp_path):
    """A run that stops at its handler modules says one line and changes
    nothing: its own temp metrics folder is deleted, and the folder a gone
    supervisor left is left for the next run that starts."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    gone = made_folder(temp, "gone", f"{socket.gethostname()} {dead_pid()} 123\n")
    out = pgfence("run", "--handlers", "no_such_module_here", env=env_for(dsn, TMPDIR=str(temp)))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("pgfence: error: ")
    assert "no_such_module_here" in out.stderr
    assert [p.name for p in temp.iterdir()] == [gone.name]
