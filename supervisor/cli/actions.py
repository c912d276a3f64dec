"""The commands that change the database: ``pgfence migrate``, ``retry``,
``cancel``, ``pause``, ``resume`` and ``prune``."""

from __future__ import annotations

import argparse
import os
import socket
import sys

from pgfence import bounds, names
from pgfence import settings as settings_mod
from pgfence import client
from pgfence.admin import commands as admin
from pgfence.cli.common import connect
from pgfence.errors import ConfigError
from pgfence.store import migrate
from pgfence.worker import retention


def cmd_migrate(args: argparse.Namespace) -> int:
    _dsn, conn = connect(args, auto_migrate=False)
    with conn:
        applied = migrate.apply(conn)
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print("schema up to date")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    if not args.ids and not args.failed:
        raise ConfigError("pgfence retry: give job ids or --failed")
    _dsn_value, conn = connect(args)
    with conn:
        result = client.retry(conn, args.ids, failed=args.failed)
    ids = result.requeued
    print(f"requeued {len(ids)} job(s)" + (f": {' '.join(map(str, ids))}" if ids else ""))
    # The others are queued all the same; a skipped job makes the exit
    # status 1, so that a script notices it.
    for job_id, holder in result.skipped:
        print(f"pgfence: skipped job {job_id}: job {holder} holds its dedupe key", file=sys.stderr)
    return 1 if result.skipped else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _dsn_value, conn = connect(args)
    with conn:
        ids = client.cancel(conn, args.ids)
    print(f"cancelled {len(ids)} job(s)" + (f": {' '.join(map(str, ids))}" if ids else ""))
    return 0 if ids else 1


def cmd_pause(args: argparse.Namespace) -> int:
    names.check(args.queue, "queue")   # before connecting: a bad name is a usage error
    _dsn_value, conn = connect(args)
    with conn:
        print(admin.pause(conn, args.queue, by=f"cli {socket.gethostname()}:{os.getpid()}"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    names.check(args.queue, "queue")
    _dsn_value, conn = connect(args)
    with conn:
        print(admin.resume(conn, args.queue))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    seconds = settings_mod.parse_duration("--retention", args.retention)
    bounds.check("retention", seconds, label="--retention")
    _dsn_value, conn = connect(args)
    with conn:
        done = retention.maintain(conn, seconds)
    ticks = f", deleted {done.ticks} tick(s) of schedules" if done.ticks else ""
    attempts = f", deleted {done.attempts} attempt row(s)" if done.attempts else ""
    print(f"dropped {done.dropped} day partition(s) of history, deleted {done.deleted} finished job(s)"
          f"{ticks}{attempts}")
    return 0
