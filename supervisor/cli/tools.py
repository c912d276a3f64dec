"""The commands that run the tools, not the product: ``pgfence demo`` and
``pgfence loadtest``.  The tools (``pgfence.tools``) are imported only here,
inside the command that runs them, so no other command (a worker above all)
imports them (the load test's options are declared by :mod:`.loadtest_flags`)."""

from __future__ import annotations

import argparse
import sys

from pgfence import settings as settings_mod
from pgfence.cli.common import connect
from pgfence.store import db, embedded


def cmd_demo(args: argparse.Namespace) -> int:
    from pgfence.tools import demo

    lease = settings_mod.parse_duration("--lease", args.lease)
    render = settings_mod.parse_duration("--render", args.render)
    demo.check_options(lease, render)     # before any server is started
    on_embedded = db.resolve_dsn(args.dsn) is None
    started = on_embedded and not embedded.state().running
    dsn, conn = connect(args)
    conn.close()
    try:
        return demo.run(dsn, lease=lease, render=render)
    finally:
        if started:
            embedded.stop()
            print(f"pgfence: stopped the embedded PostgreSQL the demo started (its data stays in "
                  f"{embedded.data_dir()})", file=sys.stderr)
        elif on_embedded:
            print(f"pgfence: left the embedded PostgreSQL running in {embedded.data_dir()} "
                  "('pgfence embedded stop' stops it)", file=sys.stderr)


def cmd_loadtest(args: argparse.Namespace) -> int:
    from pgfence.tools.loadtest import runner

    return runner.main(args)
