"""The command line's grammar: every sub-command and its options, the
settings' options generated from their declarations (pgfence.settings)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os

from pgfence import settings as settings_mod
from pgfence.cli import loadtest_flags
from pgfence.errors import ConfigError


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="PostgreSQL DSN (default: PGFENCE_DSN, DATABASE_URL, else embedded)")
    p.add_argument("--log-level", default=os.environ.get("PGFENCE_LOG_LEVEL", "INFO"),
                   choices=LOG_LEVELS, help="what to log on stderr (default: INFO; PGFENCE_LOG_LEVEL)")


def config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML settings file (default: PGFENCE_CONFIG)")


def setting_options(p: argparse.ArgumentParser, command: str) -> None:
    """One option per setting that ``command`` takes, as the setting is
    declared in pgfence.settings: flag, help and shown default.  Every
    option defaults to None, meaning "not given", so that the environment
    and the TOML file still apply (pgfence.settings.load)."""
    for declared in settings_mod.for_command(command):
        # argparse %-formats help texts.
        text = f"{declared.help} (default: {declared.shown}; {declared.env})".replace("%", "%%")
        if declared.is_boolean:
            p.add_argument(declared.flag, dest=declared.name, action=argparse.BooleanOptionalAction, default=None,
                           help=text)
        else:
            p.add_argument(declared.flag, dest=declared.name, metavar=declared.metavar, help=text)


def version() -> str:
    try:
        return importlib.metadata.version("pgfence")
    except importlib.metadata.PackageNotFoundError:   # run from a checkout that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pgfence", description="A PostgreSQL job worker that fences every completion.")
    parser.add_argument("--version", action="version", version=f"pgfence {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("migrate", help="create or upgrade the pgfence schema")
    common_options(p)

    p = sub.add_parser("work", help="run one worker process in the foreground")
    common_options(p)
    config_option(p)
    setting_options(p, "work")
    p.add_argument("--burst", action="store_true", help="exit when no job is left to claim")
    p.add_argument("--max-jobs", type=int, help="exit after this many jobs")
    p.add_argument("--name", help="the worker's name in locked_by (default host:pid:<random instance id>)")
    # UNSAFE: no lease renewal, completion by id alone.  Only the demo (and the
    # tests that reproduce the double run) use it, so it is not in --help.
    p.add_argument("--unprotected", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("run", help="the supervisor: an arbiter, N forked workers and a heartbeat manager")
    common_options(p)
    config_option(p)
    setting_options(p, "run")
    # UNSAFE, for tests that show what the fence prevents: see `work`.
    p.add_argument("--unprotected", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("enqueue", help="enqueue one job and print its id")
    common_options(p)
    p.add_argument("kind", help="the job's kind: a handler's name")
    p.add_argument("--payload", default="{}",
                   help="the payload as JSON, @FILE to read it from a file, - from stdin (default {})")
    p.add_argument("--queue", help="the job's queue (default: the kind's, else default)")
    p.add_argument("--priority", type=int, default=0, metavar="N", help="higher runs first (default 0)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", help="seconds from now before the job may run")
    when.add_argument("--run-at", metavar="ISO", help="ISO 8601 time before which the job does not run")
    p.add_argument("--max-attempts", type=int, metavar="N",
                   help="runs the job may take, errors and reclaims together (default: the kind's, else 5)")
    p.add_argument("--max-reclaims", type=int, metavar="N",
                   help="reclaims after which the job is quarantined as failed (default: the kind's, else 3)")
    p.add_argument("--dedupe-key", metavar="KEY",
                   help="while a job of this kind with this key is queued or running, print its id instead")
    p.add_argument("--concurrency-key", metavar="KEY",
                   help="the key the kind's per-key concurrency limit counts the job under (pgfence limits)")
    config_option(p)
    setting_options(p, "enqueue")
    p.add_argument("--any-kind", action="store_true",
                   help="accept a kind that neither a loaded handler module nor a worker has registered")

    p = sub.add_parser("status", help="jobs per queue and status, and running jobs")
    common_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")

    p = sub.add_parser("failed", help="the newest failed jobs with their errors")
    common_options(p)
    p.add_argument("--limit", type=int, default=20, help="how many jobs, newest first (default 20)")
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--traceback", action="store_true", help="print each job's traceback under it")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("periodic", help="the schedules of periodic jobs: next tick, last run, skipped and missed")
    common_options(p)
    p.add_argument("--json", action="store_true", help="print JSON, with ISO 8601 times, instead of a table")

    p = sub.add_parser("web", help="the web dashboard: queues, jobs, attempts; retry, cancel, pause (extra: web)")
    common_options(p)
    config_option(p)
    setting_options(p, "web")

    p = sub.add_parser("retry", help="queue failed or cancelled jobs again")
    common_options(p)
    p.add_argument("ids", nargs="*", type=int, help="ids of failed or cancelled jobs")
    p.add_argument("--failed", action="store_true", help="every failed job")

    p = sub.add_parser("cancel", help="cancel queued or running jobs")
    common_options(p)
    p.add_argument("ids", nargs="+", type=int, help="ids of queued or running jobs")

    p = sub.add_parser("pause", help="stop claiming a queue's jobs (running ones finish)")
    common_options(p)
    p.add_argument("queue", help="the queue to pause")

    p = sub.add_parser("limits", help="concurrency and rate limits per kind and per key: show them, set or reset one")
    common_options(p)
    p.add_argument("action", nargs="?", choices=("show", "set", "reset"), default="show",
                   help="show (default): every kind's limits and their use; set: a kind's limits at run time "
                        "(they win over its handler's until reset); reset: back to its handler's")
    p.add_argument("kind", nargs="?", help="the kind to set or reset")
    p.add_argument("--concurrency", type=int, help="at most this many jobs of the kind at once, cluster-wide")
    p.add_argument("--per-key", type=int, dest="per_key",
                   help="at most this many at once of one concurrency key of the kind")
    p.add_argument("--rate", help="at most this many starts a period, cluster-wide: 100/s, 10/min, 5/2h")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("resume", help="claim a paused queue's jobs again")
    common_options(p)
    p.add_argument("queue", help="the queue to resume")

    p = sub.add_parser("prune", help="delete finished jobs older than the retention, once")
    common_options(p)
    p.add_argument("--retention", default="7d", help="age of finished jobs to delete (default 7d)")

    p = sub.add_parser("demo", help="the double-run story, with and without pgfence's protections")
    common_options(p)
    p.add_argument("--lease", default="3", help="lease in seconds (default 3)")
    p.add_argument("--render", default="10", help="seconds the receipt job works (default 10)")

    p = sub.add_parser("loadtest", help="many jobs, several supervisors and injected faults, then an audit")
    common_options(p)
    loadtest_flags.add_loadtest_arguments(p)

    p = sub.add_parser("dsn", help="print the DSN in use (password removed)")
    common_options(p)

    p = sub.add_parser("embedded", help="the embedded PostgreSQL of this user: status, or stop it")
    p.add_argument("action", choices=("status", "stop"),
                   help="status: whether it runs, its data directory and DSN; stop: a fast shutdown")
    return parser
