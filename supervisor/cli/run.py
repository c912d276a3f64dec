"""The worker commands: ``pgfence work`` (one worker in the foreground) and
``pgfence run`` (the supervisor: an arbiter and its forked children)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys

from pgfence import identity, registry
from pgfence import settings as settings_mod
from pgfence.cli.common import connect, load_handlers, register_kinds, require_migrated, worker_command_settings
from pgfence.errors import ConfigError
from pgfence.observe import multiproc
from pgfence.store import db

log = logging.getLogger("pgfence")

#: The longest worker name ``--name`` may give (it is the jobs' locked_by).
NAME_MAX = 128


def cmd_work(args: argparse.Namespace) -> int:
    from pgfence.worker.engine import make_worker

    if args.max_jobs is not None and args.max_jobs < 1:
        raise ConfigError(f"invalid --max-jobs: must be at least 1, got {args.max_jobs}")
    if args.name is not None and not (0 < len(args.name) <= NAME_MAX and args.name.isprintable()):
        raise ConfigError(f"invalid --name: must be 1 to {NAME_MAX} printable characters, got "
                          f"{len(args.name)} character(s)")
    settings = worker_command_settings(args)
    if args.unprotected:
        settings = settings.replace(renew=False, fence=False)
        log.warning("UNPROTECTED worker: no lease renewal and no fence; a job may run twice")
    load_handlers(settings)
    dsn, conn = connect(args)
    worker = make_worker(dsn, settings, name=args.name)
    with conn:
        register_kinds(conn, worker.name)

    def on_signal(signum: int, _frame: object) -> None:
        # The first: record only; the loop stops claiming and finishes the
        # running jobs.  The second: stop at once, whatever runs (a job on a
        # thread or on the event loop too, which a KeyboardInterrupt raised
        # here would wait for); the jobs held come back when their leases
        # run out, as after a kill.
        if worker.stopping:
            print("pgfence: interrupted", file=sys.stderr, flush=True)
            logging.shutdown()
            os._exit(130)
        worker.request_stop()
        log.info("worker %s stopping: it finishes its running jobs (a second Ctrl-C or TERM stops it at once)",
                 worker.name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("worker %s on queues %s (lease %ss, handlers: %s)", worker.name, ",".join(settings.queues),
             settings.lease, ", ".join(registry.kinds()))
    stats = worker.run(burst=args.burst, max_jobs=args.max_jobs)
    log.info("worker %s stopped: %s", worker.name, stats.outcomes)
    return 0


def bind_metrics(settings: settings_mod.Settings) -> socket.socket | None:
    """Bind the metrics endpoint's socket now, so a port in use is one clear
    line at start, and the socket exists before any fork."""
    if settings.metrics_port == 0:
        return None
    try:
        sock = socket.create_server((settings.metrics_host, settings.metrics_port), reuse_port=False)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {settings.metrics_host}:{settings.metrics_port} "
                          f"for metrics: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def cmd_run(args: argparse.Namespace) -> int:
    settings = worker_command_settings(args)
    if args.unprotected:
        settings = settings.replace(renew=False, fence=False)
        log.warning("UNPROTECTED run: no lease renewal and no fence; a job may run twice")
    # Before anything imports prometheus_client (the handlers do, through
    # supervisor.Job): every process of this run writes its metrics there.
    metrics_dir = multiproc.prepare(settings.metrics_dir)
    own = settings.metrics_dir is None and not os.environ.get("RUNTIME_DIRECTORY")
    try:
        from pgfence.prefork.arbiter import Arbiter

        # Handlers are imported here, before the fork, so a module that fails to
        # import stops the arbiter with one line, and children share its pages.
        load_handlers(settings)
        dsn, conn = connect(args)
        instance = identity.new_instance_id()
        with conn:
            require_migrated(conn)
            register_kinds(conn, identity.supervisor_name(os.getpid(), instance))
        # The connection above is closed: the arbiter holds none when it forks.
        sock = bind_metrics(settings)
        multiproc.sweep_gone()
        arbiter = Arbiter(dsn, settings, reload_settings=lambda: worker_command_settings(args), metrics_sock=sock,
                          instance=instance)
        log.info("pgfence run: %d workers, queues %s, lease %gs, database %s, metrics files in %s",
                 settings.workers, ",".join(settings.queues), settings.lease, db.redact(dsn), metrics_dir)
        return arbiter.run()
    finally:
        if own:
            shutil.rmtree(metrics_dir, ignore_errors=True)   # our own temp dir, also after bad input
