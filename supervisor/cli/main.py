"""The ``pgfence`` command line.

Every user mistake (bad JSON, unknown kind, unreachable database, invalid
setting) ends as one line on stderr and a non-zero exit, never a traceback;
input is validated before anything is written.

This module dispatches: the grammar is :mod:`.parser`; the commands live
beside it, by what they do (:mod:`.run` the workers, :mod:`.enqueue`,
:mod:`.reports` and :mod:`.actions` the operator's, :mod:`.web`,
:mod:`.embedded`, :mod:`.tools` the demo and the load test), on what they
share (:mod:`.common`); :mod:`.errors` keeps DSNs out of what is reported.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import psycopg

from pgfence.cli import actions, errors, reports, run, tools
from pgfence.cli import embedded as embedded_cli
from pgfence.cli import enqueue as enqueue_cli
from pgfence.cli import limits as limits_cli
from pgfence.cli import web as web_cli
from pgfence.cli.common import NO_HANDLERS
from pgfence.cli.parser import LOG_LEVELS, build_parser
from pgfence.errors import ConfigError, PgfenceError
from pgfence.prefork import proctitle
from pgfence.store import db

__all__ = ["COMMANDS", "NO_HANDLERS", "build_parser", "main"]


#: Every sub-command's function, by name (the modules beside this one).
COMMANDS = {
    "migrate": actions.cmd_migrate, "work": run.cmd_work, "run": run.cmd_run, "enqueue": enqueue_cli.cmd_enqueue,
    "status": reports.cmd_status, "failed": reports.cmd_failed, "periodic": reports.cmd_periodic,
    "web": web_cli.cmd_web, "retry": actions.cmd_retry, "cancel": actions.cmd_cancel, "pause": actions.cmd_pause,
    "resume": actions.cmd_resume, "prune": actions.cmd_prune, "demo": tools.cmd_demo, "dsn": reports.cmd_dsn,
    "loadtest": tools.cmd_loadtest, "embedded": embedded_cli.cmd_embedded, "limits": limits_cli.cmd_limits,
}


def _configure_logging(level_name: str) -> None:
    """pgfence's own loggers at the chosen level; other libraries' (the
    pool, matplotlib, the embedded server's wheel) only from WARNING up,
    unless DEBUG asks for everything."""
    level = logging.getLevelName(level_name)
    root = level if level <= logging.DEBUG else max(level, logging.WARNING)
    logging.basicConfig(level=root, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pgfence").setLevel(level)


def _hide_argv(argv: Sequence[str]) -> None:
    """Replace what ``ps`` shows of this process (its argv) by the command
    with every DSN password masked: ``pgfence work --dsn
    postgresql://u:***@db/app``.  ``pgfence run``'s processes set titles of
    their own later; every other command keeps this one."""
    proctitle.set(" ".join(["pgfence", *(db.mask_passwords(arg) for arg in argv)]))


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
        _hide_argv(argv)
    try:
        args = build_parser().parse_args(argv)
        # argparse checks --log-level against its choices, but not the
        # default it took from PGFENCE_LOG_LEVEL.
        if getattr(args, "log_level", "INFO") not in LOG_LEVELS:
            raise ConfigError(f"invalid log-level: expected one of {', '.join(LOG_LEVELS)}, "
                              f"got {args.log_level!r}")
        _configure_logging(getattr(args, "log_level", "INFO"))
        code = COMMANDS[args.command](args)
        # Flush here, not at exit, so a reader gone early is handled below.
        sys.stdout.flush()
        return code
    except BrokenPipeError as exc:
        if not errors.stdout_gone():
            print(f"pgfence: error: {db.translate(exc)}", file=sys.stderr)
            return 1
        # The reader of our output went away (`pgfence status | head -1`):
        # not an error of ours to report.  Exit as a process that SIGPIPE
        # ended would, and keep the interpreter's last flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except PgfenceError as exc:
        print(f"pgfence: error: {errors.scrub_argv(str(exc), argv)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("pgfence: interrupted", file=sys.stderr)
        return 130
    except (psycopg.Error, OSError) as exc:
        print(f"pgfence: error: {db.translate(exc)}", file=sys.stderr)
        return 1
