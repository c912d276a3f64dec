"""Settings of the Django project the ported django-tasks-db suite runs in.

The server is PGFENCE_TEST_DSN (default: the local PostgreSQL); Django's
test runner creates its test database there.  A worker started by a test
is given that test database's name in PGFENCE_PORT_DB_NAME, so that it
claims the jobs the test enqueued.
"""

import os

import django
from psycopg.conninfo import conninfo_to_dict

DSN = os.environ.get("PGFENCE_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
_params = conninfo_to_dict(DSN)

SECRET_KEY = "pgfence-django-port"
USE_TZ = True
DEBUG = False
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "pgfence.contrib.django",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("PGFENCE_PORT_DB_NAME") or _params.get("dbname", "postgres"),
        "USER": _params.get("user", ""),
        "PASSWORD": _params.get("password", ""),
        "HOST": _params.get("host", ""),
        "PORT": _params.get("port", ""),
        # One test database per Django version, so that the three can run at once.
        "TEST": {"NAME": "test_pgfence_django_port_{}{}".format(*django.VERSION[:2])},
    }
}

BACKEND = "pgfence.contrib.django.PgfenceBackend"

TASKS = {
    "default": {
        "BACKEND": BACKEND,
        "QUEUES": ["default", "queue-1"],
        "OPTIONS": {"MAX_ATTEMPTS": 1, "TASK_MODULES": ["tasks"]},
    }
}

# A worker a test starts logs each task's start and end (Django's task
# signals' log lines, through the handler pgfence's --log-level sets up),
# which the test reads on its output.
if os.environ.get("PGFENCE_PORT_DB_NAME"):
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {name: {"level": "INFO"} for name in ("django.tasks", "django_tasks")},
    }
