"""The commands that read: ``pgfence status`` (with the concurrency and rate
limits' use), ``failed`` and ``periodic`` (tables for a terminal, or JSON), and
``dsn``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import psycopg

from pgfence import errortext
from pgfence.admin import commands as admin
from pgfence.admin import periodic
from pgfence.cli.common import connect, find_dsn
from pgfence.errors import ConfigError
from pgfence.store import db


def _report(args: argparse.Namespace, read: Callable[[psycopg.Connection], Any]) -> Any:
    """What ``read`` returns on the command's connection; with --json,
    printed as JSON (json.dumps escapes every control character: safe as it
    is) and None returned."""
    _dsn_value, conn = connect(args)
    with conn:
        data = read(conn)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return None
    return data


def cmd_status(args: argparse.Namespace) -> int:
    data = _report(args, admin.status)
    if data is None:
        return 0
    states = ["queued", "running", "done", "failed", "cancelled"]
    print(f"{'queue':<16}" + "".join(f"{s:>11}" for s in states))
    for queue, counts in sorted(data["queues"].items()):
        print(f"{queue:<16}" + "".join(f"{counts.get(s, 0):>11}" for s in states))
    if data["estimated"]:
        print("(done, failed and cancelled estimated from a sample of a large history)")
    if data["running"]:
        print()
        print(f"{'running id':>10}  {'queue':<12} {'kind':<16} {'attempt':>7}  {'lease left':>10}  owner")
        for r in data["running"]:
            print(f"{r['id']:>10}  {r['queue']:<12} {r['kind']:<16} {r['attempt']:>7}  "
                  f"{r['lease_left']:>9.1f}s  {r['locked_by']}")
    if data.get("limits"):
        print()
        for line in limits_table(data["limits"]):
            print(line)
    return 0


def limits_table(rows: list[dict[str, Any]]) -> list[str]:
    """``status``'s table of concurrency and rate limits: per kind the
    limit, the per-key limit and the rate in force ("-": none), the slots in
    use (running and admitted), the jobs waiting for a slot or the rate and
    those held until their run_at (as ``pgfence limits show`` counts
    them)."""
    def shown(value: int | str | None) -> str:
        return "-" if value is None else str(value)

    lines = [f"{'kind':<24} {'limit':>8} {'per key':>8} {'rate':>10} {'in use':>8} {'waiting':>8} {'scheduled':>9}"]
    for r in rows:
        # A kind comes from a producer or a handler: escaped for the terminal.
        lines.append(f"{errortext.one_line(r['kind']):<24} {shown(r['concurrency']):>8} "
                     f"{shown(r['per_key_concurrency']):>8} {shown(r.get('rate')):>10} {r['in_use']:>8} "
                     f"{r['waiting']:>8} {r['scheduled']:>9}")
    return lines


def cmd_failed(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigError(f"invalid --limit: must be at least 1, got {args.limit}")
    jobs = _report(args, lambda conn: admin.failed(conn, limit=args.limit, queue=args.queue, kind=args.kind))
    if jobs is None:
        return 0
    if not jobs:
        print("no failed jobs")
        return 0
    # Errors, kinds and queues come from handlers and producers: every one
    # is printed escaped, so no control character reaches the terminal.
    print(f"{'id':>10}  {'failed at':<19}  {'queue':<12} {'kind':<16} {'attempts':>8}  error")
    for job in jobs:
        when = (job["finished_at"] or "")[:19].replace("T", " ")
        spent = f"{job['attempts_spent']}/{job['max_attempts']}"
        print(f"{job['id']:>10}  {when:<19}  {errortext.one_line(job['queue']):<12} "
              f"{errortext.one_line(job['kind']):<16} {spent:>8}  {errortext.one_line(job['last_error'] or '')}")
        if args.traceback and job["traceback"]:
            for line in errortext.printable(job["traceback"]).split("\n"):
                print(f"{'':>12}{line}")
    return 0


def cmd_periodic(args: argparse.Namespace) -> int:
    data = _report(args, periodic.listing)
    if data is None:
        return 0
    for line in periodic.table(data):
        print(line)
    return 0


def cmd_dsn(args: argparse.Namespace) -> int:
    dsn, _ = find_dsn(args)
    print(db.redact(dsn))
    return 0
