"""The Django app ``pgfence.contrib.django``: ``manage.py migrate`` applies
pgfence's schema to the database of every pgfence tasks backend (after
Django's own migrations, idempotent with ``pgfence migrate``), and
``manage.py pgfence ...`` is pgfence's command line."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class PgfenceConfig(AppConfig):
    name = "pgfence.contrib.django"
    label = "pgfence"
    verbose_name = "pgfence"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        post_migrate.connect(migrate_schema, sender=self, dispatch_uid="pgfence.contrib.django.migrate")


def migrate_schema(sender: Any, using: str = "default", verbosity: int = 1, **kwargs: Any) -> None:
    """After ``manage.py migrate`` on ``using``: apply pgfence's pending
    migrations there, when a pgfence tasks backend keeps its jobs in it."""
    from pgfence.contrib.django import connection
    from pgfence.contrib.django.backend import pgfence_backends
    from pgfence.store import db, migrate

    if using not in {b.database for b in pgfence_backends().values()}:
        return
    raw = connection.psycopg_connection(using)
    with db.translated():
        applied = migrate.apply(raw)
    if verbosity >= 1:
        for m in applied:
            print(f"  pgfence: applied {m.version:04d}_{m.name}")
