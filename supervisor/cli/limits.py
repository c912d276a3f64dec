"""``pgfence limits``: show every kind's concurrency limits and their use,
set a kind's at run time, or reset them to its handler's declaration."""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any

from pgfence import errortext, limits, names
from pgfence.admin import limits as admin
from pgfence.cli.common import connect
from pgfence.errors import ConfigError


def _value(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no concurrency limits")
        return
    print(f"{'kind':<24} {'concurrency':>11} {'per key':>8} {'rate':>9} {'running':>8} {'admitted':>8} "
          f"{'waiting':>8} {'scheduled':>9}  source")
    for r in rows:
        source = ("set" if any(v is not None for v in r["set"].values())
                  else "handler" if any(v is not None for v in r["declared"].values()) else "none")
        print(f"{errortext.one_line(r['kind']):<24} {_value(r['concurrency']):>11} "
              f"{_value(r['per_key_concurrency']):>8} {r['rate'] or '-':>9} {r['running']:>8} {r['admitted']:>8} "
              f"{r['waiting']:>8} "
              f"{r['scheduled']:>9}  {source}")


def cmd_limits(args: argparse.Namespace) -> int:
    # Bad input is refused before connecting: one line, nothing written.
    if args.action == "show":
        if args.kind is not None or args.concurrency is not None or args.per_key is not None or args.rate:
            raise ConfigError("pgfence limits show takes no kind or limit (set KIND --concurrency N)")
    else:
        if args.kind is None:
            raise ConfigError(f"pgfence limits {args.action}: give the kind")
        names.check(args.kind, "kind")
    if args.action == "set":
        limits.check_limit(args.concurrency, "--concurrency")
        limits.check_limit(args.per_key, "--per-key")
        limits.parse_rate(args.rate, "--rate")
        if args.concurrency is None and args.per_key is None and args.rate is None:
            raise ConfigError("pgfence limits set: give --concurrency, --per-key, --rate, or several")
    if args.action == "reset" and (args.concurrency is not None or args.per_key is not None or args.rate):
        raise ConfigError("pgfence limits reset takes no limit: it goes back to the handler's")
    by = f"cli {socket.gethostname()}:{os.getpid()}"
    kind: str = args.kind or ""
    _dsn_value, conn = connect(args)
    with conn:
        if args.action == "show":
            rows = admin.list_limits(conn)
        elif args.action == "set":
            rows = [admin.set_limits(conn, kind, concurrency=args.concurrency,
                                     per_key_concurrency=args.per_key, rate=args.rate, by=by)]
        else:
            rows = [admin.reset(conn, kind, by=by)]
    if args.json:
        print(json.dumps(rows if args.action == "show" else rows[0], indent=2, sort_keys=True))
    else:
        _print(rows)
    return 0
