"""The ``pgfence`` command line.

Every user mistake (bad JSON, unknown kind, unreachable database, invalid
setting) ends as one line on stderr and a non-zero exit, never a traceback;
input is validated before anything is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

from pgfence.cli import admin, periodic
from pgfence import bounds, names
from pgfence.store import db
from pgfence.store import embedded
from pgfence import errortext
from pgfence.worker import kinds
from pgfence.store import migrate
from pgfence.observe import multiproc
from pgfence.prefork import proctitle
from pgfence import registry
from pgfence.worker import retention
from pgfence import settings as settings_mod
from pgfence.errors import ConfigError, PgfenceError, SchemaMissing, UnknownHandler
from pgfence.tools.loadtest import options as loadtest_options
from pgfence.producer import enqueue

log = logging.getLogger("pgfence")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="PostgreSQL DSN (default: PGFENCE_DSN, DATABASE_URL, else embedded)")
    p.add_argument("--log-level", default=os.environ.get("PGFENCE_LOG_LEVEL", "INFO"),
                   choices=LOG_LEVELS)


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML settings file (default: PGFENCE_CONFIG)")


def _setting_options(p: argparse.ArgumentParser, command: str) -> None:
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


def _version() -> str:
    try:
        return importlib.metadata.version("pgfence")
    except importlib.metadata.PackageNotFoundError:   # run from a checkout that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgfence", description="A PostgreSQL job worker that fences every completion.")
    parser.add_argument("--version", action="version", version=f"pgfence {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("migrate", help="create or upgrade the pgfence schema")
    _common(p)

    p = sub.add_parser("work", help="run one worker process in the foreground")
    _common(p)
    _config_option(p)
    _setting_options(p, "work")
    p.add_argument("--burst", action="store_true", help="exit when no job is left to claim")
    p.add_argument("--max-jobs", type=int, help="exit after this many jobs")
    p.add_argument("--name", help="the worker's name in locked_by (default host:pid:<random instance id>)")
    # UNSAFE: no lease renewal, completion by id alone.  Only the demo (and the
    # tests that reproduce the double run) use it, so it is not in --help.
    p.add_argument("--unprotected", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("run", help="the supervisor: an arbiter, N forked workers and a heartbeat manager")
    _common(p)
    _config_option(p)
    _setting_options(p, "run")
    # UNSAFE, for tests that show what the fence prevents: see `work`.
    p.add_argument("--unprotected", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("enqueue", help="enqueue one job and print its id")
    _common(p)
    p.add_argument("kind")
    p.add_argument("--payload", default="{}",
                   help="the payload as JSON, @FILE to read it from a file, - from stdin (default {})")
    p.add_argument("--queue")
    p.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", help="seconds from now before the job may run")
    when.add_argument("--run-at", help="ISO 8601 time before which the job does not run")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--max-reclaims", type=int)
    p.add_argument("--dedupe-key")
    _config_option(p)
    _setting_options(p, "enqueue")
    p.add_argument("--any-kind", action="store_true",
                   help="accept a kind that neither a loaded handler module nor a worker has registered")

    p = sub.add_parser("status", help="jobs per queue and status, and running jobs")
    _common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("failed", help="the newest failed jobs with their errors")
    _common(p)
    p.add_argument("--limit", type=int, default=20, help="how many jobs, newest first (default 20)")
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--traceback", action="store_true", help="print each job's traceback under it")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("periodic", help="the schedules of periodic jobs: next tick, last run, skipped and missed")
    _common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("web", help="the web dashboard: queues, jobs, attempts; retry, cancel, pause (extra: web)")
    _common(p)
    _config_option(p)
    _setting_options(p, "web")

    p = sub.add_parser("retry", help="queue failed or cancelled jobs again")
    _common(p)
    p.add_argument("ids", nargs="*", type=int)
    p.add_argument("--failed", action="store_true", help="every failed job")

    p = sub.add_parser("cancel", help="cancel queued or running jobs")
    _common(p)
    p.add_argument("ids", nargs="+", type=int)

    p = sub.add_parser("pause", help="stop claiming a queue's jobs (running ones finish)")
    _common(p)
    p.add_argument("queue")

    p = sub.add_parser("resume", help="claim a paused queue's jobs again")
    _common(p)
    p.add_argument("queue")

    p = sub.add_parser("prune", help="delete finished jobs older than the retention, once")
    _common(p)
    p.add_argument("--retention", default="7d", help="age of finished jobs to delete (default 7d)")

    p = sub.add_parser("demo", help="the double-run story, with and without pgfence's protections")
    _common(p)
    p.add_argument("--lease", default="3", help="lease in seconds (default 3)")
    p.add_argument("--render", default="10", help="seconds the receipt job works (default 10)")

    p = sub.add_parser("loadtest", help="many jobs, several supervisors and injected faults, then an audit")
    _common(p)
    loadtest_options.add_arguments(p)

    p = sub.add_parser("dsn", help="print the DSN in use (password removed)")
    _common(p)

    p = sub.add_parser("embedded", help="the embedded PostgreSQL of this user: status, or stop it")
    p.add_argument("action", choices=("status", "stop"))
    return parser


# -- helpers --------------------------------------------------------------------


def _dsn(args: argparse.Namespace) -> tuple[str, bool]:
    """The DSN and whether it is the embedded server."""
    dsn = db.resolve_dsn(args.dsn)
    if dsn:
        return dsn, False
    return _embedded_dsn(), True


def _embedded_dsn() -> str:
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


def _connect(args: argparse.Namespace, *, auto_migrate: bool = True) -> tuple[str, psycopg.Connection[Any]]:
    dsn, is_embedded = _dsn(args)
    conn = db.connect(dsn)
    # The embedded server is pgfence's own: set it up on first use so that a
    # newcomer's first command just works.  A user's database is migrated
    # only by an explicit `pgfence migrate`.
    if is_embedded and auto_migrate:
        migrate.apply(conn)
    return dsn, conn


def _command_settings(args: argparse.Namespace) -> settings_mod.Settings:
    """The settings of this command: its flags over the environment over
    the TOML file over the defaults."""
    cli = {d.name: getattr(args, d.name, None) for d in settings_mod.for_command(args.command)}
    return settings_mod.load(cli, config_path=getattr(args, "config", None))


#: What a worker command without handler modules says.
NO_HANDLERS = ("no handler modules: name them with --handlers myapp.jobs "
               "(or PGFENCE_HANDLERS, or handlers = [...] in the settings file)")


def _worker_command_settings(args: argparse.Namespace) -> settings_mod.Settings:
    """The settings of ``work`` or ``run``, which need handler modules: a
    worker without any could only put back every job it claims, and
    pgfence loads none by default (its bundled ones are examples)."""
    settings = _command_settings(args)
    if not settings.handlers:
        raise ConfigError(NO_HANDLERS)
    return settings


def _load_handlers(settings: settings_mod.Settings) -> None:
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


def _require_migrated(conn: psycopg.Connection) -> None:
    """Refuse (SchemaMissing: one line) a database with migrations pending."""
    missing = migrate.pending(conn)
    if missing:
        raise SchemaMissing(f"pgfence schema is not up to date ({len(missing)} migration(s) pending): "
                            "run 'pgfence migrate'")


def _register_kinds(conn: Any) -> None:
    """Record the loaded handlers' options in pgfence.kinds, where every
    producer's enqueue finds them."""
    changed = kinds.register(conn, registry.specs())
    if changed:
        log.info("recorded the options of kind(s) %s in pgfence.kinds", ", ".join(changed))


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and jsonb) does not.
    raise ConfigError(f"invalid --payload: not JSON ({name} is not a JSON value)")


def _read_payload(arg: str) -> str:
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


def _parse_payload(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid --payload: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def _parse_time(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"invalid --run-at: not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        value = value.astimezone()
    return value


# -- commands -------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    _dsn, conn = _connect(args, auto_migrate=False)
    with conn:
        applied = migrate.apply(conn)
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print("schema up to date")
    return 0


def cmd_work(args: argparse.Namespace) -> int:
    from pgfence.worker.engine import make_worker

    settings = _worker_command_settings(args)
    if args.unprotected:
        settings = settings.replace(renew=False, fence=False)
        log.warning("UNPROTECTED worker: no lease renewal and no fence; a job may run twice")
    _load_handlers(settings)
    dsn, conn = _connect(args)
    with conn:
        _register_kinds(conn)
    worker = make_worker(dsn, settings, name=args.name)

    def on_signal(signum: int, _frame: object) -> None:
        # Record only; the loop stops claiming and finishes the running job.
        if worker.stopping:
            raise KeyboardInterrupt
        worker.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("worker %s on queues %s (lease %ss, handlers: %s)", worker.name, ",".join(settings.queues),
             settings.lease, ", ".join(registry.kinds()))
    stats = worker.run(burst=args.burst, max_jobs=args.max_jobs)
    log.info("worker %s stopped: %s", worker.name, stats.outcomes)
    return 0


def _bind_metrics(settings: settings_mod.Settings) -> socket.socket | None:
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
    settings = _worker_command_settings(args)
    if args.unprotected:
        settings = settings.replace(renew=False, fence=False)
        log.warning("UNPROTECTED run: no lease renewal and no fence; a job may run twice")
    # Before anything imports prometheus_client (the handlers do, through
    # supervisor.Job): every process of this run writes its metrics there.
    metrics_dir = multiproc.prepare(settings.metrics_dir)
    from pgfence.prefork.arbiter import Arbiter

    # Handlers are imported here, before the fork, so a module that fails to
    # import stops the arbiter with one line, and children share its pages.
    _load_handlers(settings)
    dsn, conn = _connect(args)
    with conn:
        _require_migrated(conn)
        _register_kinds(conn)
    # The connection above is closed: the arbiter holds none when it forks.
    sock = _bind_metrics(settings)
    arbiter = Arbiter(dsn, settings, reload_settings=lambda: _worker_command_settings(args), metrics_sock=sock)
    log.info("pgfence run: %d workers, queues %s, lease %gs, database %s, metrics files in %s", settings.workers,
             ",".join(settings.queues), settings.lease, db.redact(dsn), metrics_dir)
    try:
        return arbiter.run()
    finally:
        if settings.metrics_dir is None and not os.environ.get("RUNTIME_DIRECTORY"):
            shutil.rmtree(metrics_dir, ignore_errors=True)   # our own temp dir


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = _parse_payload(_read_payload(args.payload))
    # The handler modules as every command finds them: --handlers, else
    # PGFENCE_HANDLERS, else the config file.  None is fine: a producer need
    # not import the handlers' code, and the kind is then checked against
    # those that workers registered in pgfence.kinds.
    settings = _command_settings(args)
    registry.load(settings.handlers)
    delay = settings_mod.parse_duration("--delay", args.delay) if args.delay is not None else None
    run_at = _parse_time(args.run_at) if args.run_at else None
    _dsn_value, conn = _connect(args)
    with conn:
        # A kind no local module defines is accepted when a worker has
        # registered it; otherwise it is one line, and nothing is written.
        if not args.any_kind and registry.find(args.kind) is None and not kinds.known(conn, args.kind):
            known = ", ".join(registry.kinds()) or "none"
            raise UnknownHandler(f"unknown job kind {args.kind!r} (known: {known}); no worker has registered it "
                                 "either (--any-kind enqueues it anyway)")
        job_id = enqueue(conn, args.kind, payload, queue=args.queue, priority=args.priority,
                         run_at=run_at, delay=delay, max_attempts=args.max_attempts,
                         max_reclaims=args.max_reclaims, dedupe_key=args.dedupe_key)
    print(job_id)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _dsn_value, conn = _connect(args)
    with conn:
        data = admin.status(conn)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
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
    return 0


def cmd_failed(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigError(f"invalid --limit: must be at least 1, got {args.limit}")
    _dsn_value, conn = _connect(args)
    with conn:
        jobs = admin.failed(conn, limit=args.limit, queue=args.queue, kind=args.kind)
    if args.json:
        # json.dumps escapes every control character: safe as it is.
        print(json.dumps(jobs, indent=2, sort_keys=True))
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
    _dsn_value, conn = _connect(args)
    with conn:
        data = periodic.listing(conn)
    if args.json:
        # json.dumps escapes every control character: safe as it is.
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    for line in periodic.table(data):
        print(line)
    return 0


#: The environment variable that holds the dashboard's password.
WEB_PASSWORD_ENV = "PGFENCE_WEB_PASSWORD"


def cmd_web(args: argparse.Namespace) -> int:
    from pgfence.web import serve

    settings = _command_settings(args)
    password = os.environ.get(WEB_PASSWORD_ENV) or None
    serve.check_host(settings.web_host, password)
    # Refused before anything listens: the web extra missing, the database
    # unreachable, the schema not migrated.
    serve.check_installed()
    dsn, conn = _connect(args)
    with conn:
        _require_migrated(conn)
    sock = serve.bind(settings.web_host, settings.web_port)
    log.info("pgfence web on http://%s:%d/ (database %s%s%s%s)", serve.shown_host(settings.web_host),
             settings.web_port, db.redact(dsn), ", read-only" if settings.web_read_only else "",
             ", payloads redacted" if settings.web_redact_payloads else "",
             ", password required" if password else "")
    return serve.run(sock, dsn, read_only=settings.web_read_only, redact_payloads=settings.web_redact_payloads,
                     password=password, log_level=args.log_level)


def cmd_retry(args: argparse.Namespace) -> int:
    if not args.ids and not args.failed:
        raise ConfigError("pgfence retry: give job ids or --failed")
    _dsn_value, conn = _connect(args)
    with conn:
        result = admin.retry(conn, args.ids, failed=args.failed)
    ids = result.requeued
    print(f"requeued {len(ids)} job(s)" + (f": {' '.join(map(str, ids))}" if ids else ""))
    # The others are queued all the same; a skipped job makes the exit
    # status 1, so that a script notices it.
    for job_id, holder in result.skipped:
        print(f"pgfence: skipped job {job_id}: job {holder} holds its dedupe key", file=sys.stderr)
    return 1 if result.skipped else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _dsn_value, conn = _connect(args)
    with conn:
        ids = admin.cancel(conn, args.ids)
    print(f"cancelled {len(ids)} job(s)" + (f": {' '.join(map(str, ids))}" if ids else ""))
    return 0 if ids else 1


def cmd_pause(args: argparse.Namespace) -> int:
    names.check(args.queue, "queue")   # before connecting: a bad name is a usage error
    _dsn_value, conn = _connect(args)
    with conn:
        print(admin.pause(conn, args.queue, by=f"cli {socket.gethostname()}:{os.getpid()}"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    names.check(args.queue, "queue")
    _dsn_value, conn = _connect(args)
    with conn:
        print(admin.resume(conn, args.queue))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    seconds = settings_mod.parse_duration("--retention", args.retention)
    bounds.check("retention", seconds, label="--retention")
    _dsn_value, conn = _connect(args)
    with conn:
        done = retention.maintain(conn, seconds)
    ticks = f", deleted {done.ticks} tick(s) of schedules" if done.ticks else ""
    attempts = f", deleted {done.attempts} attempt row(s)" if done.attempts else ""
    print(f"dropped {done.dropped} day partition(s) of history, deleted {done.deleted} finished job(s)"
          f"{ticks}{attempts}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pgfence.tools import demo

    lease = settings_mod.parse_duration("--lease", args.lease)
    render = settings_mod.parse_duration("--render", args.render)
    demo.check_options(lease, render)     # before any server is started
    on_embedded = db.resolve_dsn(args.dsn) is None
    started = on_embedded and not embedded.state().running
    dsn, conn = _connect(args)
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


def cmd_dsn(args: argparse.Namespace) -> int:
    dsn, _ = _dsn(args)
    print(db.redact(dsn))
    return 0


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


COMMANDS = {
    "migrate": cmd_migrate, "work": cmd_work, "run": cmd_run, "enqueue": cmd_enqueue, "status": cmd_status,
    "failed": cmd_failed, "periodic": cmd_periodic, "web": cmd_web,
    "retry": cmd_retry, "cancel": cmd_cancel, "pause": cmd_pause, "resume": cmd_resume, "prune": cmd_prune,
    "demo": cmd_demo, "dsn": cmd_dsn,
    "loadtest": cmd_loadtest, "embedded": cmd_embedded,
}


def _configure_logging(level_name: str) -> None:
    """pgfence's own loggers at the chosen level; other libraries' (the
    pool, matplotlib, the embedded server's wheel) only from WARNING up,
    unless DEBUG asks for everything."""
    level = logging.getLevelName(level_name)
    root = level if level <= logging.DEBUG else max(level, logging.WARNING)
    logging.basicConfig(level=root, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pgfence").setLevel(level)


def _dsn_arguments(argv: Sequence[str]) -> list[str]:
    """The command-line arguments (or the values of ``--opt=value`` ones)
    that hold a DSN with a password, however mistyped their flag."""
    found = []
    for arg in argv:
        for text in (arg, arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else ""):
            if text and db.has_password(text):
                found.append(text)
    return found


def _scrub_argv(message: str, argv: Sequence[str]) -> str:
    """``message`` (argparse quotes arguments it cannot place: a mistyped
    ``--dns postgresql://u:pw@...``) without any DSN of the command line."""
    for dsn in _dsn_arguments(argv):
        message = db.scrub(message, dsn)
    return message


def _hide_argv(argv: Sequence[str]) -> None:
    """Replace what ``ps`` shows of this process (its argv) by the command
    with every DSN password masked: ``pgfence work --dsn
    postgresql://u:***@db/app``.  ``pgfence run``'s processes set titles of
    their own later; every other command keeps this one."""
    proctitle.set(" ".join(["pgfence", *(db.mask_passwords(arg) for arg in argv)]))


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll
    reports an error on the write end of a pipe that has no reader left)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return False
    return any(mask & select.POLLERR for _fd, mask in events)


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
        if not _stdout_gone():
            print(f"pgfence: error: {db.translate(exc)}", file=sys.stderr)
            return 1
        # The reader of our output went away (`pgfence status | head -1`):
        # not an error of ours to report.  Exit as a process that SIGPIPE
        # ended would, and keep the interpreter's last flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except PgfenceError as exc:
        print(f"pgfence: error: {_scrub_argv(str(exc), argv)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("pgfence: interrupted", file=sys.stderr)
        return 130
    except (psycopg.Error, OSError) as exc:
        print(f"pgfence: error: {db.translate(exc)}", file=sys.stderr)
        return 1
