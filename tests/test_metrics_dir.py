"""``--metrics-dir`` wipes only a directory of pgfence's own: one it created
or an empty one it took, marked by its marker file.  A directory holding
anything else (a user's SQLite database) is refused, and nothing is deleted."""

from __future__ import annotations

import sqlite3

import pytest

from pgtools import env_for, pgfence
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
