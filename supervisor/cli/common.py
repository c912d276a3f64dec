"""What the commands share: the DSN and the connection (the embedded server's
when none is given), each command's settings, and the handler modules a
worker command loads and records."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import psycopg

from pgfence import registry
from pgfence import settings as settings_mod
from pgfence.errors import ConfigError, SchemaMissing
from pgfence.store import db, embedded, migrate
from pgfence.worker import kinds

log = logging.getLogger("pgfence")



def find_dsn(args: argparse.Namespace) -> tuple[str, bool]:
    """The DSN and whether it is the embedded server."""
    dsn = db.resolve_dsn(args.dsn)
    if dsn:
        return dsn, False
    return embedded_dsn(), True


def embedded_dsn() -> str:
    """Start or find this user's embedded server, and say where it lives
    (one line on stderr, so that stdout stays the command's own)."""
    pgdata = embedded.data_dir()
    was_running = embedded.state(pgdata).running
    dsn = embedded.start(pgdata)
    if was_running:
        print(f"pgfence: using the embedded PostgreSQL in {pgdata}", file=sys.stderr)
    else:
        print(f"pgfence: started the embedded PostgreSQL in {pgdata}; it keeps running "
              "('pgfence embedded stop' stops it)", file=sys.stderr)
    return dsn


def connect(args: argparse.Namespace, *, auto_migrate: bool = True) -> tuple[str, psycopg.Connection[Any]]:
    dsn, is_embedded = find_dsn(args)
    conn = db.connect(dsn)
    # The embedded server is pgfence's own: set it up on first use so that a
    # newcomer's first command just works.  A user's database is migrated
    # only by an explicit `pgfence migrate`.
    if is_embedded and auto_migrate:
        migrate.apply(conn)
    return dsn, conn


def command_settings(args: argparse.Namespace) -> settings_mod.Settings:
    """The settings of this command: its flags over the environment over
    the TOML file over the defaults."""
    cli = {d.name: getattr(args, d.name, None) for d in settings_mod.for_command(args.command)}
    return settings_mod.load(cli, config_path=getattr(args, "config", None))


#: What a worker command without handler modules says.
NO_HANDLERS = ("no handler modules: name them with --handlers myapp.jobs "
               "(or PGFENCE_HANDLERS, or handlers = [...] in the settings file)")


def worker_command_settings(args: argparse.Namespace) -> settings_mod.Settings:
    """The settings of ``work`` or ``run``, which need handler modules: a
    worker without any could only put back every job it claims, and
    pgfence loads none by default (its bundled ones are examples)."""
    settings = command_settings(args)
    if not settings.handlers:
        raise ConfigError(NO_HANDLERS)
    return settings


def load_handlers(settings: settings_mod.Settings) -> None:
    """Import the handler modules, refuse a heartbeat setting that cannot
    keep their leases, and warn about each handler whose queue this worker
    does not serve: its jobs would wait for another worker."""
    registry.load(settings.handlers)
    # Imported here, not at the top: it imports prometheus_client, which
    # `pgfence run` must not import before its metrics directory is set
    # (the handler modules just loaded import it too).
    from pgfence.renewal.renewer import validate_heartbeat

    # Refused before anything is written (pgfence.kinds among them).
    validate_heartbeat(settings.heartbeat, registry.specs())
    for spec in registry.unserved(settings.queues):
        log.warning("handler %r puts its jobs on queue %r, which this worker does not serve (queues: %s)",
                    spec.kind, spec.queue or "default", ",".join(settings.queues))


def require_migrated(conn: psycopg.Connection) -> None:
    """Refuse (SchemaMissing: one line) a database with migrations pending."""
    missing = migrate.pending(conn)
    if missing:
        raise SchemaMissing(f"pgfence schema is not up to date ({len(missing)} migration(s) pending): "
                            "run 'pgfence migrate'")


def register_kinds(conn: Any, by: str) -> None:
    """Record the loaded handlers' options in pgfence.kinds, where every
    producer's enqueue finds them, as written ``by`` this supervisor or worker."""
    changed = kinds.register(conn, registry.specs(), by=by)
    if changed:
        log.info("recorded the options of kind(s) %s in pgfence.kinds", ", ".join(changed))
