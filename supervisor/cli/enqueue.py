"""``pgfence enqueue``: one job from the command line, its payload as JSON
text, a file or standard input."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from pgfence import limits, registry
from pgfence import settings as settings_mod
from pgfence.cli.common import command_settings, connect
from pgfence.errors import ConfigError, UnknownHandler
from pgfence.producer import enqueue
from pgfence.worker import kinds


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and jsonb) does not.
    raise ConfigError(f"invalid --payload: not JSON ({name} is not a JSON value)")


def read_payload(arg: str) -> str:
    """The payload's JSON text: ``arg`` itself, or the contents of the file
    ``@PATH``, or standard input for ``-``.  The last two carry payloads
    larger than the command line allows (about 128 KB on Linux)."""
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        path = arg[1:]
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read()
        except OSError as exc:
            raise ConfigError(f"invalid --payload: cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"invalid --payload: {path} is not UTF-8 text ({exc.reason})") from None
    return arg


def parse_payload(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid --payload: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def parse_time(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"invalid --run-at: not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        value = value.astimezone()
    return value


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_payload(read_payload(args.payload))
    # The handler modules as every command finds them: --handlers, else
    # PGFENCE_HANDLERS, else the config file.  None is fine: a producer need
    # not import the handlers' code, and the kind is then checked against
    # those that workers registered in pgfence.kinds.
    settings = command_settings(args)
    registry.load(settings.handlers)
    delay = settings_mod.parse_duration("--delay", args.delay) if args.delay is not None else None
    limits.check_key(args.concurrency_key)   # before connecting: one line, nothing written
    run_at = parse_time(args.run_at) if args.run_at else None
    _dsn_value, conn = connect(args)
    with conn:
        # A kind no local module defines is accepted when a worker has
        # registered it; otherwise it is one line, and nothing is written.
        if not args.any_kind and registry.find(args.kind) is None and not kinds.known(conn, args.kind):
            known = ", ".join(registry.kinds()) or "none"
            raise UnknownHandler(f"unknown job kind {args.kind!r} (known: {known}); no worker has registered it "
                                 "either (--any-kind enqueues it anyway)")
        job_id = enqueue(conn, args.kind, payload, queue=args.queue, priority=args.priority,
                         run_at=run_at, delay=delay, max_attempts=args.max_attempts,
                         max_reclaims=args.max_reclaims, dedupe_key=args.dedupe_key,
                         concurrency_key=args.concurrency_key)
    print(job_id)
    return 0
