"""Each setting declared once (pgfence.settings), and what follows from it:
the command-line options, the environment, the docs' table.  Also
`pgfence --version`, the handler modules a worker must be given, and the
example handlers kept out of pgfence's own schema and internals."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pgfence
import psycopg
import pytest
from pgfence import settings as settings_mod
from pgfence import settings_table
from pgfence.cli.main import NO_HANDLERS, build_parser
from pgfence.errors import ConfigError
from pgfence.handlers import tables
from pgfence.store import migrate
from pgtools import env_for, scalar
from pgtools import pgfence as run_pgfence

ROOT = Path(__file__).resolve().parent.parent


# -- the declarations (no database) --------------------------------------------------


def test_the_docs_settings_page_shows_the_generated_table():
    """The settings reference renders the table from the declarations at
    build time (docs/_gen/hooks.py), in place of its marked region."""
    page = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    start = page.index("<!-- generated: settings -->\n")
    assert "<!-- end generated -->" in page[start:]
    assert "| `lease` |" not in page, "the page holds a copy of the table: it is generated, remove the copy"
    sys.path.insert(0, str(ROOT / "docs" / "_gen"))
    try:
        import reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "_gen"))
    assert reference.settings_table() == settings_table.render()


def test_the_table_has_one_row_per_setting_users_set():
    rows = settings_table.render().splitlines()[2:]
    names = [row.split("|")[1].strip().strip("`") for row in rows]
    assert names == [f.name for f in settings_mod.dataclasses.fields(settings_mod.Settings)
                     if f.name not in ("renew", "fence")]
    assert "| `lease` | `30s` | `--lease`, `PGFENCE_LEASE` | work, run | " in settings_table.render()
    assert "| `listen` | `true` | `--listen`/`--no-listen`, `PGFENCE_LISTEN` | work, run | " in settings_table.render()


def _options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for action in sub.choices[command]._actions for s in action.option_strings}


@pytest.mark.parametrize("command", ["work", "run", "enqueue", "status", "web"])
def test_each_command_takes_exactly_its_declared_settings_as_flags(command):
    options = _options(build_parser(), command)
    declared = {d.flag for d in settings_mod.DECLARATIONS.values() if not d.hidden}
    expected = {d.flag for d in settings_mod.for_command(command)}
    assert options & declared == expected
    booleans = {d.flag for d in settings_mod.for_command(command) if d.is_boolean}
    assert {"--no-" + flag[2:] for flag in booleans} <= options
    # The hidden switches are set by code (--unprotected), never by a flag.
    assert not options & {"--renew", "--fence", "--no-renew", "--no-fence"}


def test_every_setting_is_read_from_its_environment_variable_flag_and_toml_key(tmp_path):
    values = {"queues": ("a", "b"), "lease": 20.0, "heartbeat": 5.0, "batch": 3, "threads": 4, "async_concurrency": 50,
              "poll_interval": 2.0,
              "timeout": 60.0, "backoff_base": 2.0, "backoff_max": 120.0, "unknown_kind_delay": 10.0,
              "unknown_kind_timeout": 600.0, "retention": 86400.0, "prune_interval": 30.0,
              "handlers": ("x.jobs", "y"), "workers": 5, "graceful_timeout": 12.0,
              "max_jobs_per_child": 500, "max_memory_per_child": 512,
              "lost_lease_kill_after": 3.0, "idle_in_transaction_timeout": 90.0, "metrics_host": "0.0.0.0",
              "metrics_port": 9500, "metrics_dir": "/run/m", "listen": False, "prepare": False,
              "vacuum_warn_dead_tuples": 50000, "vacuum_warn_horizon": 120.0, "self_vacuum_dead_tuples": 20000,
              "periodic_grace": 20.0, "web_host": "0.0.0.0", "web_port": 8500, "web_read_only": True,
              "web_redact_payloads": True}
    # Schedules are tables, with no flag: test_periodic_units reads them
    # from TOML and from the environment.
    assert [d.name for d in settings_mod.DECLARATIONS.values() if not d.hidden and not d.commands] == ["periodic"]
    users = [d for d in settings_mod.DECLARATIONS.values() if not d.hidden and d.commands]
    assert sorted(values) == sorted(d.name for d in users)          # this test covers every setting

    def text(value: object) -> str:
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    from_env = settings_mod.load({}, env={d.env: text(values[d.name]) for d in users})
    given = {}
    # Each setting through the command that takes it: run, or web.
    for command in ("run", "web"):
        argv = [command]
        takers = [d for d in users if command in d.commands]
        for d in takers:
            argv += ([d.flag] if values[d.name] else ["--no-" + d.flag[2:]]) if d.is_boolean \
                else [d.flag, text(values[d.name])]
        args = build_parser().parse_args(argv)
        given |= {d.name: getattr(args, d.name) for d in takers}
    assert sorted(given) == sorted(values)
    from_cli = settings_mod.load(given, env={})
    toml = tmp_path / "pgfence.toml"
    toml.write_text("\n".join(f'{d.name.replace("_", "-")} = {text(values[d.name])!r}' for d in users)
                    .replace("'", '"'))
    from_toml = settings_mod.load({}, env={}, config_path=str(toml))
    for loaded in (from_env, from_cli, from_toml):
        assert {name: getattr(loaded, name) for name in values} == values


def test_vacuum_settings_take_none_and_refuse_nonsense():
    loaded = settings_mod.load({}, env={"PGFENCE_VACUUM_WARN_DEAD_TUPLES": "none", "PGFENCE_VACUUM_WARN_HORIZON": "none",
                                        "PGFENCE_SELF_VACUUM_DEAD_TUPLES": "none"})
    assert (loaded.vacuum_warn_dead_tuples, loaded.vacuum_warn_horizon, loaded.self_vacuum_dead_tuples) == \
        (None, None, None)
    with pytest.raises(ConfigError, match=r"^invalid self-vacuum-dead-tuples: must be a whole number of at least 1, "
                                          r"or none, got 0$"):
        settings_mod.load({}, env={"PGFENCE_SELF_VACUUM_DEAD_TUPLES": "0"})
    with pytest.raises(ConfigError, match=r"^invalid vacuum-warn-horizon: must be a number of seconds from 1s to 30d"):
        settings_mod.load({}, env={"PGFENCE_VACUUM_WARN_HORIZON": "0.5"})


def test_converters_keep_their_one_line_errors():
    with pytest.raises(ConfigError, match=r"^invalid batch: expected a whole number, got '2\.5'$"):
        settings_mod.load({}, env={"PGFENCE_BATCH": "2.5"})
    with pytest.raises(ConfigError, match=r"^invalid listen: expected true or false, got 'maybe'$"):
        settings_mod.load({}, env={"PGFENCE_LISTEN": "maybe"})
    with pytest.raises(ConfigError, match=r"^invalid queues: a value is required$"):
        settings_mod.load({"queues": ""}, env={})
    with pytest.raises(ConfigError, match=r"^invalid lease: expected seconds \(like 30, 30s, 5m, 7d\), got 'soon'$"):
        settings_mod.load({"lease": "soon"}, env={})
    with pytest.raises(ConfigError, match=r"^unknown setting 'renew' in the command line$"):
        settings_mod.load({"renew": "false"}, env={})
    assert settings_mod.load({"timeout": "none", "retention": "none"}, env={}).timeout is None
    assert settings_mod.load({}, env={}).handlers == ()


# -- the command line ----------------------------------------------------------------


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    out = run_pgfence("--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"pgfence {version('pgfence')}\n", "")
    assert version("pgfence") == "0.2.0"


@pytest.mark.parametrize("command", ["work", "run"])
def test_a_worker_without_handler_modules_is_one_line_and_exit_2(dsn, conn, command):
    env = env_for(dsn)
    del env["PGFENCE_HANDLERS"]
    conn.execute("INSERT INTO pgfence.jobs (kind) VALUES ('noop')")
    out = run_pgfence(command, "--burst" if command == "work" else "--workers=1", env=env, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"pgfence: error: {NO_HANDLERS}\n")
    assert NO_HANDLERS == ("no handler modules: name them with --handlers myapp.jobs "
                           "(or PGFENCE_HANDLERS, or handlers = [...] in the settings file)")
    # Nothing was claimed nor recorded.
    assert conn.execute("SELECT status, attempt FROM pgfence.all_jobs").fetchall() == [("queued", 0)]
    assert scalar(conn, "SELECT count(*) FROM pgfence.kinds") == 0


def test_enqueue_without_handler_modules_checks_the_kinds_workers_registered(dsn, conn):
    env = env_for(dsn)
    del env["PGFENCE_HANDLERS"]
    out = run_pgfence("enqueue", "noop", env=env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("pgfence: error: unknown job kind 'noop' (known: none); no worker has registered "
                          "it either (--any-kind enqueues it anyway)\n")
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs") == 0

    work = run_pgfence("work", "--burst", "--handlers", "pgfence.handlers.builtin", env=env)
    assert work.returncode == 0, work.stderr
    out = run_pgfence("enqueue", "noop", env=env)
    assert (out.returncode, out.stderr) == (0, "")
    assert conn.execute("SELECT id, kind, status FROM pgfence.all_jobs").fetchall() == [(int(out.stdout), "noop",
                                                                                     "queued")]


# -- the examples' tables and imports ------------------------------------------------


def _tables(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """The tables, partitioned ones included but not their partitions (the
    days of pgfence.job_history: tests/test_history_retention.py)."""
    return conn.execute("""
        SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
           AND n.nspname NOT IN ('pg_catalog', 'information_schema')
           AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2""").fetchall()


def test_a_fresh_migrate_creates_pgfence_tables_only_and_the_examples_create_theirs(empty_dsn):
    out = run_pgfence("migrate", dsn=empty_dsn)
    assert out.returncode == 0, out.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _tables(conn) == [("pgfence", "admit_pending"), ("pgfence", "bulk_actions"), ("pgfence", "job_attempts"),
                                 ("pgfence", "job_history"), ("pgfence", "jobs"),
                                 ("pgfence", "kinds"), ("pgfence", "limits"), ("pgfence", "migrations"),
                                 ("pgfence", "queue_pauses"),
                                 ("pgfence", "schedule_ticks"), ("pgfence", "schedules"), ("pgfence", "supervisors")]
        assert scalar(conn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence_examples'") == 0
        # 0002 is recorded (its file stays, empty) so that versions have no gap.
        assert conn.execute("SELECT name FROM pgfence.migrations WHERE version = 2").fetchall() == \
            [("handler_tables",)]
        for _ in range(2):                                   # idempotent
            tables.create_tables(conn)
        assert _tables(conn) == [("pgfence", "admit_pending"), ("pgfence", "bulk_actions"), ("pgfence", "job_attempts"),
                                 ("pgfence", "job_history"), ("pgfence", "jobs"),
                                 ("pgfence", "kinds"), ("pgfence", "limits"), ("pgfence", "migrations"),
                                 ("pgfence", "queue_pauses"),
                                 ("pgfence", "schedule_ticks"), ("pgfence", "schedules"), ("pgfence", "supervisors"),
                                 ("pgfence_examples", "effects"),
                                 ("pgfence_examples", "receipts")]
        assert migrate.pending(conn) == []


def test_the_load_test_creates_the_example_tables_it_writes(empty_dsn):
    from pgfence.tools.loadtest.server import Server

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate.apply(conn)
        assert [t for t in _tables(conn) if t[0] != "pgfence"] == []
    Server(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert [t for t in _tables(conn) if t[0] != "pgfence"] == [("pgfence_examples", "effects"),
                                                                   ("pgfence_examples", "receipts")]


def test_a_database_that_applied_the_old_0002_stays_up_to_date(empty_dsn):
    """A database migrated by 0.1 has 0002 recorded and its two tables: it
    needs no migration for 0002, and its old tables are left alone."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate.apply(conn)
        conn.execute("CREATE TABLE pgfence.receipts (id bigint)")   # as 0.1's 0002 left them
        conn.execute("CREATE TABLE pgfence.effects (id bigint)")
        assert migrate.pending(conn) == [] and migrate.apply(conn) == []
        assert ("pgfence", "effects") in _tables(conn)


def test_example_handlers_import_only_the_public_api():
    """The examples are what users copy: nothing from pgfence's internals
    (pgfence.store, pgfence.worker...), only the names `from pgfence import`
    offers, and each other."""
    public = set(pgfence.__all__)
    found = {}
    for path in sorted((ROOT / "handlers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pgfence":
                found.setdefault(path.name, set()).update(f"{node.module}:{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names if a.name.split(".")[0] == "pgfence"}
                assert not names, f"{path.name} imports {names}"
    bad = {name: sorted(n for n in names if not (n.startswith("pgfence:") and n.split(":")[1] in public
                                                 or n.startswith("pgfence.handlers.")))
           for name, names in found.items()}
    assert {name: names for name, names in bad.items() if names} == {}
    assert found["builtin.py"] == {"pgfence:Job", "pgfence:handler", "pgfence.handlers.payloads:seconds_of",
                                   "pgfence.handlers.tables:INSERT_EFFECT"}
