"""``pgfence web``: the dashboard, served by uvicorn (the ``web`` extra)."""

from __future__ import annotations

import argparse
import logging
import os

from pgfence.cli.common import command_settings, connect, require_migrated
from pgfence.store import db

log = logging.getLogger("pgfence")


#: The environment variable that holds the dashboard's password.
WEB_PASSWORD_ENV = "PGFENCE_WEB_PASSWORD"


def cmd_web(args: argparse.Namespace) -> int:
    from pgfence.web import serve

    settings = command_settings(args)
    password = os.environ.get(WEB_PASSWORD_ENV) or None
    serve.check_host(settings.web_host, password)
    # Refused before anything listens: the web extra missing, the database
    # unreachable, the schema not migrated.
    serve.check_installed()
    dsn, conn = connect(args)
    with conn:
        require_migrated(conn)
    sock = serve.bind(settings.web_host, settings.web_port)
    log.info("pgfence web on http://%s:%d/ (database %s%s%s%s)", serve.shown_host(settings.web_host),
             settings.web_port, db.redact(dsn), ", read-only" if settings.web_read_only else "",
             ", payloads redacted" if settings.web_redact_payloads else "",
             ", password required" if password else "")
    return serve.run(sock, dsn, read_only=settings.web_read_only, redact_payloads=settings.web_redact_payloads,
                     password=password, log_level=args.log_level)
