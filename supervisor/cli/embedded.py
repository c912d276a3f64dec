"""``pgfence embedded``: the embedded PostgreSQL of this user, its status, or
stop it."""

from __future__ import annotations

import argparse

from pgfence.store import db, embedded


def cmd_embedded(args: argparse.Namespace) -> int:
    current = embedded.state()
    if args.action == "stop":
        if embedded.stop(current.pgdata):
            print(f"stopped the embedded PostgreSQL in {current.pgdata}")
        else:
            print(f"no embedded PostgreSQL running in {current.pgdata}")
        return 0
    if current.running:
        print(f"embedded PostgreSQL: running (pid {current.pid})")
    else:
        print("embedded PostgreSQL: not running (a command without a DSN starts it)")
    print(f"data directory: {current.pgdata}")
    if current.dsn:
        print(f"dsn: {db.redact(current.dsn)}")
    return 0
