"""Settings of the example shop: one app (orders), its tasks on pgfence.

The database is named by PGFENCE_DSN (a libpq URL or key=value string),
default the local ``shop`` database.
"""

import os

import psycopg

SECRET_KEY = "example-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "pgfence.contrib.django",
    "orders",
]

_dsn = psycopg.conninfo.conninfo_to_dict(os.environ.get("PGFENCE_DSN", "dbname=shop host=127.0.0.1 user=postgres"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", "shop"),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        # A worker keeps its connection between tasks (close_old_connections
        # runs around each task, as around a request).
        "CONN_MAX_AGE": 600,
    }
}

TASKS = {
    "default": {
        "BACKEND": "pgfence.contrib.django.PgfenceBackend",
        "QUEUES": ["default", "mail"],
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": int(os.environ.get("SHOP_MAX_ATTEMPTS", "3"))},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
