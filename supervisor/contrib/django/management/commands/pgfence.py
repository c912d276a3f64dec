"""``manage.py pgfence <command> ...``: pgfence's command line, run with the
database of the project's pgfence tasks backend.

The DSN comes from ``DATABASES`` (the backend's ``OPTIONS["DATABASE"]``):
the password goes to the environment of the process (``PGPASSWORD``),
never onto a command line, into a log or into a process title.  ``run`` and
``work`` load the project's tasks as handlers
(``pgfence.contrib.django.handlers``) and claim from the backend's queues,
unless ``--handlers`` or ``--queues`` say otherwise.  Django is set up
before the supervisor forks; each forked process forgets the database
connections it inherited without sending anything over them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError

#: The commands that run handlers.
RUNNERS = ("run", "work")


_AT_FORK: list[bool] = []


def _drop_inherited_at_fork() -> None:
    from pgfence.contrib.django import connection

    if not _AT_FORK:
        os.register_at_fork(after_in_child=connection.drop_inherited)
        _AT_FORK.append(True)


def _flag(argv: list[str], name: str) -> bool:
    return any(a == name or a.startswith(f"{name}=") for a in argv)


class Command(BaseCommand):
    help = "pgfence's command line (run, work, status, failed, web, retry, ...) on the project's database"
    requires_system_checks: ClassVar[list[str]] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("argv", nargs=argparse.REMAINDER, help="pgfence's command and its options")

    def handle(self, *args: Any, **options: Any) -> None:
        from django.db import connections

        from pgfence.contrib.django import connection
        from pgfence.contrib.django.backend import pgfence_backends

        argv: list[str] = list(options["argv"])
        backends = pgfence_backends()
        if not backends:
            raise CommandError("no pgfence tasks backend in TASKS (BACKEND 'pgfence.contrib.django.PgfenceBackend')")
        backend = next(iter(backends.values()))
        try:
            dsn, password = connection.dsn(backend.database)
        except Exception as exc:  # noqa: BLE001 - ImproperlyConfigured, said in one line
            raise CommandError(str(exc)) from None
        os.environ["PGFENCE_DSN"] = dsn
        if password:
            os.environ["PGPASSWORD"] = password
        if argv and argv[0] in RUNNERS:
            if not _flag(argv, "--handlers"):
                argv += ["--handlers", "pgfence.contrib.django.handlers"]
            if not _flag(argv, "--queues") and "PGFENCE_QUEUES" not in os.environ:
                queues = sorted({q for b in backends.values() for q in b.queues})
                argv += ["--queues", ",".join(queues)]
            # What the parent opened (system checks, a tasks module's
            # import) is closed before any fork, and each forked process
            # forgets what it still inherits.
            connections.close_all()
            _drop_inherited_at_fork()
        from pgfence.cli.main import main

        code = main(argv)
        sys.stdout.flush()
        if code:
            raise SystemExit(code)   # pgfence said why, in one line
