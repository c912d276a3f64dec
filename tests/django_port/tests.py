"""django-tasks-db's backend and worker suite, ported onto pgfence's Django
tasks backend (``pgfence.contrib.django.PgfenceBackend``) and its worker
(``manage.py pgfence work`` / ``run``).

Every case of the original is kept where it applies, with its assertions;
where a case read django-tasks-db's model, it reads pgfence's tables
(``pgfence.jobs``, ``pgfence.job_history``) or ``get_result`` instead.
PORTING.md beside this file lists each case changed or dropped, and why.

The one intended difference in behaviour: a worker killed with SIGKILL
leaves its task to be reclaimed once its lease runs out, so the task ends
READY or SUCCESSFUL, never stuck RUNNING (test_kill).

Run with ``.ci/django-port PYTHON`` (Django's own test runner, from this
folder, settings ``settings``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr
from datetime import timedelta
from functools import partial
from io import StringIO
from typing import Any, cast

import django
import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import CommandError, call_command, execute_from_command_line
from django.db import connection, transaction
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from django.utils import timezone

import tasks as test_tasks
from pgfence.contrib.django import PgfenceBackend, compat
from pgfence.contrib.django import connection as pg_connection

if django.VERSION >= (6, 0):
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.base import Task
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued

    TASKS_LOGGER = "django.tasks"
else:
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.base import Task
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued

    TASKS_LOGGER = "django_tasks"

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = "pgfence.contrib.django.PgfenceBackend"
OPTIONS = {"MAX_ATTEMPTS": 1, "TASK_MODULES": ["tasks"]}

#: How long a wait for a worker or a task may take before the test fails.
DEADLINE = 20.0


def wait_for(condition: Callable[[], Any], timeout: float = DEADLINE, what: str = "the condition",
             worker: Any = None) -> Any:
    """Poll ``condition`` until it is true; its value.  Fails after ``timeout``
    (with what ``worker`` printed, if given)."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        gone = worker is not None and worker.process.poll() is not None
        if gone or time.monotonic() > end:
            said = f"; the worker printed:\n{''.join(worker.lines)}" if worker is not None else ""
            raise AssertionError(f"{what} did not hold within {timeout} s{said}")
        time.sleep(0.05)


def random_name() -> str:
    return f"port-{uuid.uuid4().hex[:12]}"


# -- reads of pgfence's tables (what the original read through DBTaskResult) --

_ALL_JOBS = "(SELECT id, status, run_at FROM pgfence.jobs UNION ALL SELECT id, status, run_at FROM pgfence.job_history)"


def _scalar(sql: str, params: tuple[Any, ...] = ()) -> Any:
    with connection.cursor() as c:
        c.execute(sql, params)
        return c.fetchone()[0]


def count_jobs(status: str | None = None) -> int:
    """Jobs of any status (or of ``status``: queued, running, done, failed)."""
    if status is None:
        return int(_scalar(f"SELECT count(*) FROM {_ALL_JOBS} j"))
    return int(_scalar(f"SELECT count(*) FROM {_ALL_JOBS} j WHERE status = %s", (status,)))


def count_ready() -> int:
    """Jobs a worker could claim now: DBTaskResult.objects.ready()."""
    return int(_scalar("SELECT count(*) FROM pgfence.jobs WHERE status = 'queued' AND run_at <= now()"))


def count_successful() -> int:
    return count_jobs("done")


def count_failed() -> int:
    return count_jobs("failed")


def insert_job(kind: str, args: list[Any] | None = None, queue: str = "default") -> str:
    """A job of ``kind`` written as a producer in SQL would: the equivalent of
    creating a DBTaskResult with an arbitrary task_path."""
    payload = psycopg.types.json.Jsonb({"args": args or [], "kwargs": {}})
    raw = pg_connection.psycopg_connection("default")
    return str(raw.execute("SELECT pgfence.enqueue(%s, %s, %s)", (kind, payload, queue)).fetchone()[0])  # type: ignore[index]


def new_connection() -> psycopg.Connection[Any]:
    """A connection of its own to the test database: what other sessions see."""
    dsn, password = pg_connection.dsn("default")
    return psycopg.connect(dsn, password=password, autocommit=True)


def count_in_new_connection() -> int:
    with new_connection() as other:
        return int(other.execute("SELECT count(*) FROM pgfence.jobs").fetchone()[0])  # type: ignore[index]


def reset_pgfence() -> None:
    """TransactionTestCase flushes Django's tables only; pgfence's are its own."""
    with connection.cursor() as c:
        c.execute("TRUNCATE pgfence.jobs, pgfence.job_history, pgfence.job_attempts")


class PgfenceTestCase(TransactionTestCase):
    def setUp(self) -> None:
        super().setUp()
        reset_pgfence()


class DatabaseBackendTestCase(PgfenceTestCase):
    @contextlib.contextmanager
    def _capture_task_enqueued_signal(self) -> Iterator[list[tuple[type, Any]]]:
        received: list[tuple[type, Any]] = []

        def capture_signal(sender: type, task_result: Any, **kwargs: Any) -> None:
            received.append((sender, task_result))

        task_enqueued.connect(capture_signal, dispatch_uid="port_enqueue_signal", weak=False)
        try:
            yield received
        finally:
            task_enqueued.disconnect(capture_signal, dispatch_uid="port_enqueue_signal")

    def assert_fresh(self, result: Any) -> None:
        self.assertTrue(result.id.isdigit() and int(result.id) > 0, result.id)
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertFalse(result.is_finished)
        self.assertIsNone(result.started_at)
        self.assertIsNone(result.last_attempted_at)
        self.assertIsNone(result.finished_at)
        with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
            result.return_value  # noqa: B018
        self.assertEqual(result.attempts, 0)

    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], PgfenceBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, OPTIONS)

    def test_enqueue_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task), self._capture_task_enqueued_signal() as received:
                result = cast(Task, task).enqueue(1, two=3)

                self.assert_fresh(result)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(received, [(PgfenceBackend, result)])

    async def test_enqueue_task_async(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task), self._capture_task_enqueued_signal() as received:
                result = await cast(Task, task).aenqueue()

                self.assert_fresh(result)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(received, [(PgfenceBackend, result)])

    def test_get_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.noop_task, [], {})

        new_result = default_task_backend.get_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task, [], {})

        new_result = await default_task_backend.aget_result(result.id)

        self.assertEqual(result, new_result)

    def assert_refreshed(self, result: Any) -> None:
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(result.is_finished)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(result.attempts, 1)

    def test_refresh_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, (), {})

        run_worker()   # the job is finished by pgfence's worker, not by an UPDATE

        self.assert_fresh(result)

        result.refresh()

        self.assert_refreshed(result)

    async def test_refresh_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {})

        await sync_to_async(run_worker)()

        self.assert_fresh(result)

        await result.arefresh()

        self.assert_refreshed(result)

    def test_get_missing_result(self) -> None:
        for missing in [str(uuid.uuid4()), "999999999"]:
            with self.subTest(missing), self.assertRaises(TaskResultDoesNotExist):
                default_task_backend.get_result(missing)

    async def test_async_get_missing_result(self) -> None:
        for missing in [str(uuid.uuid4()), "999999999"]:
            with self.subTest(missing), self.assertRaises(TaskResultDoesNotExist):
                await default_task_backend.aget_result(missing)

    def test_invalid_uuid(self) -> None:
        for invalid in ["123", "abc", "-1", "0", "", " 1"]:
            with self.subTest(invalid), self.assertRaises(TaskResultDoesNotExist):
                default_task_backend.get_result(invalid)

    async def test_async_invalid_uuid(self) -> None:
        for invalid in ["123", "abc", "-1"]:
            with self.subTest(invalid), self.assertRaises(TaskResultDoesNotExist):
                await default_task_backend.aget_result(invalid)

    def test_invalid_task_path(self) -> None:
        job_id = insert_job("subprocess.check_output", [["exit", "1"]])

        with self.assertRaisesMessage(TaskResultDoesNotExist, "'subprocess.check_output', which is not a task"):
            default_task_backend.get_result(job_id)

    def test_missing_task_path(self) -> None:
        job_id = insert_job("missing.func")

        with self.assertRaisesMessage(TaskResultDoesNotExist, "'missing.func', which names no task"):
            default_task_backend.get_result(job_id)

    def test_task_name(self) -> None:
        job_id = insert_job("tasks.noop_task")
        self.assertEqual(default_task_backend.get_result(job_id).task.name, "noop_task")

        for task_path in ["tasks.task_not_found", "tasks.module_not_found.module_not_found", "unexpected_function"]:
            with self.subTest(task_path), self.assertRaises(TaskResultDoesNotExist):
                default_task_backend.get_result(insert_job(task_path))

    def test_check(self) -> None:
        errors = list(default_task_backend.check())

        self.assertEqual(len(errors), 0, errors)

    @override_settings(INSTALLED_APPS=[])
    def test_database_backend_app_missing(self) -> None:
        errors = list(default_task_backend.check())

        self.assertEqual(len(errors), 1, errors)
        self.assertIn("pgfence.contrib.django", errors[0].hint)

    def test_priority_range_check(self) -> None:
        for priority in [-101, 101]:
            with self.subTest(priority), self.assertRaises(InvalidTaskError):
                test_tasks.noop_task.using(priority=priority)

        for priority in [100, -100, 0]:
            with self.subTest(priority):
                result = test_tasks.noop_task.using(priority=priority).enqueue()
                stored = _scalar("SELECT priority FROM pgfence.jobs WHERE id = %s", (int(result.id),))
                self.assertEqual(stored, priority)
                self.assertEqual(default_task_backend.get_result(result.id).task.priority, 0)

    def test_doesnt_wait_until_transaction_commit(self) -> None:
        with transaction.atomic():
            result = test_tasks.noop_task.enqueue()

            self.assertIsNotNone(result.enqueued_at)

            self.assertEqual(count_jobs(), 1)

            self.assertEqual(count_in_new_connection(), 0)

        self.assertEqual(count_in_new_connection(), 1)

    def test_enqueue_rolls_back_with_transaction(self) -> None:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            test_tasks.noop_task.enqueue()
            raise RuntimeError("roll back")

        self.assertEqual(count_jobs(), 0)
        self.assertEqual(count_in_new_connection(), 0)

    def test_enqueue_logs(self) -> None:
        with self.assertLogs(TASKS_LOGGER, level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()

        self.assertEqual(len(captured_logs.output), 1)
        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

    def test_run_after_tz(self) -> None:
        for use_tz in [True, False]:
            with self.subTest(use_tz=use_tz), override_settings(USE_TZ=use_tz):
                result = test_tasks.noop_task.enqueue()
                self.assertIsNone(default_task_backend.get_result(result.id).task.run_after)

    def test_run_after_is_run_at(self) -> None:
        run_after = timezone.now() + timedelta(hours=1)
        result = test_tasks.noop_task.using(run_after=run_after).enqueue()

        self.assertEqual(_scalar("SELECT run_at FROM pgfence.jobs WHERE id = %s", (int(result.id),)), run_after)

    def test_validate_on_enqueue(self) -> None:
        with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["unknown_queue"]}}):
            task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with self.assertRaisesMessage(InvalidTaskError, "Queue 'unknown_queue' is not valid for backend"):
            task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["unknown_queue"]}}):
            task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with self.assertRaisesMessage(InvalidTaskError, "Queue 'unknown_queue' is not valid for backend"):
            await task_with_custom_queue_name.aenqueue()

    def test_custom_id_function(self) -> None:
        for id_function in ["uuid.uuid1", uuid.uuid1, "django.contrib.postgres.functions.RandomUUID"]:
            tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": {"id_function": id_function}}}
            with self.subTest(id_function), override_settings(TASKS=tasks), \
                    self.assertRaisesMessage(InvalidTaskBackend, "unknown OPTIONS id_function"):
                test_tasks.noop_task.enqueue()


def run_worker(*args: str, queues: str | None = "default", name: str | None = None,
               log_level: str = "WARNING") -> str:
    """``manage.py pgfence work --burst`` in this process, until no job is
    ready; the worker's name.  (Its INFO lines, with ``log_level="INFO"``,
    are read through assertLogs.)"""
    argv = ["work", "--burst", "--poll-interval", "0.1s", "--log-level", log_level,
            "--name", name or random_name(), *args]
    if queues is not None:
        argv += ["--queues", queues]
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    level = logging.getLogger("pgfence").level
    try:
        call_command("pgfence", *argv)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
        logging.getLogger("pgfence").setLevel(level)
    return argv[argv.index("--name") + 1]


def command_error(*argv: str) -> str:
    """What ``manage.py pgfence ...`` says on stderr when it refuses ``argv``
    (it must exit non-zero)."""
    output = StringIO()
    with redirect_stderr(output), contextlib.suppress(SystemExit):
        execute_from_command_line(["manage.py", "pgfence", *argv])
        raise AssertionError(f"pgfence {' '.join(argv)} was not refused")
    return output.getvalue()


@override_settings(
    TASKS={
        "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue-1"], "OPTIONS": OPTIONS},
        "dummy": {"BACKEND": f"{compat.PACKAGE}.backends.dummy.DummyBackend"},
    }
)
class DatabaseBackendWorkerTestCase(PgfenceTestCase):
    worker_id = random_name()
    run_worker = staticmethod(partial(run_worker, name=worker_id))

    def assert_ran(self, result: Any, status: Any) -> None:
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertEqual(result.status, status)

    def test_run_enqueued_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = cast(Task, task).enqueue()
                self.assertEqual(count_ready(), 1)

                self.assertEqual(result.status, TaskResultStatus.READY)

                self.run_worker()

                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertEqual(result.attempts, 0)
                result.refresh()
                self.assert_ran(result, TaskResultStatus.SUCCESSFUL)
                self.assertEqual(result.attempts, 1)
                self.assertEqual(result.worker_ids, [self.worker_id])

                self.assertEqual(count_ready(), 0)

    def test_batch_processes_all_tasks(self) -> None:
        for _ in range(3):
            test_tasks.noop_task.enqueue()
        test_tasks.failing_task_value_error.enqueue()

        self.assertEqual(count_ready(), 4)

        self.run_worker()

        self.assertEqual(count_ready(), 0)
        self.assertEqual(count_successful(), 3)
        self.assertEqual(count_failed(), 1)

    def test_no_tasks(self) -> None:
        self.run_worker()

        self.assertEqual(count_jobs(), 0)

    def test_doesnt_process_different_queue(self) -> None:
        result = test_tasks.noop_task.using(queue_name="queue-1").enqueue()

        self.assertEqual(count_ready(), 1)

        self.run_worker()

        self.assertEqual(count_ready(), 1)

        self.run_worker(queues=result.task.queue_name)

        self.assertEqual(count_ready(), 0)

    def test_process_all_queues(self) -> None:
        test_tasks.noop_task.using(queue_name="queue-1").enqueue()

        self.assertEqual(count_ready(), 1)

        self.run_worker()

        self.assertEqual(count_ready(), 1)

        self.run_worker(queues=None)   # every queue of the backend

        self.assertEqual(count_ready(), 0)

    def test_process_all_queues_excluding_one_queue(self) -> None:
        test_tasks.noop_task.enqueue()
        excluded_result = test_tasks.noop_task.using(queue_name="queue-1").enqueue()

        self.assertEqual(count_ready(), 2)

        self.run_worker(queues="default")   # the backend's queues but queue-1

        excluded_result.refresh()
        self.assertEqual(excluded_result.status, TaskResultStatus.READY)
        self.assertEqual(count_ready(), 1)
        self.assertEqual(count_successful(), 1)

    def test_excluding_unknown_queue_processes_selected_queues(self) -> None:
        test_tasks.noop_task.using(queue_name="queue-1").enqueue()

        self.assertEqual(count_ready(), 1)

        self.run_worker(queues="queue-1,missing")

        self.assertEqual(count_ready(), 0)
        self.assertEqual(count_successful(), 1)

    def test_failing_task(self) -> None:
        result = test_tasks.failing_task_value_error.enqueue()
        self.assertEqual(count_ready(), 1)

        self.run_worker()

        self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assert_ran(result, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018

        self.assertEqual(result.errors[0].exception_class, ValueError)
        traceback = result.errors[0].traceback
        self.assertTrue(traceback and traceback.endswith("ValueError: This task failed due to ValueError\n"),
                        traceback)

        self.assertEqual(count_ready(), 0)

    def test_complex_exception(self) -> None:
        result = test_tasks.complex_exception.enqueue()
        self.assertEqual(count_ready(), 1)

        self.run_worker()

        self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assert_ran(result, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018

        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn('ValueError(ValueError("This task failed"))', result.errors[0].traceback)

        self.assertEqual(count_ready(), 0)

    def test_complex_return_value(self) -> None:
        from pgfence import ResultRejected

        result = test_tasks.complex_return_value.enqueue()

        self.run_worker()

        result.refresh()

        self.assert_ran(result, TaskResultStatus.FAILED)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, ResultRejected)
        self.assertIn("TypeError", result.errors[0].traceback)
        self.assertIn("is not JSON serializable", result.errors[0].traceback)

    def test_doesnt_process_different_backend(self) -> None:
        result = test_tasks.failing_task_value_error.enqueue()
        self.assertEqual(count_ready(), 1)

        # The dummy backend beside it is no pgfence backend: manage.py
        # pgfence serves the pgfence one.
        self.run_worker()

        self.assertEqual(count_ready(), 0)
        result.refresh()
        self.assertEqual(result.backend, "default")
        self.assertEqual(result.status, TaskResultStatus.FAILED)

    @override_settings(TASKS={"dummy": {"BACKEND": f"{compat.PACKAGE}.backends.dummy.DummyBackend"}})
    def test_incorrect_backend(self) -> None:
        with self.assertRaisesMessage(CommandError, "no pgfence tasks backend in TASKS"):
            call_command("pgfence", "work", "--burst")

    def test_negative_interval(self) -> None:
        self.assertIn("poll", command_error("work", "--burst", "--poll-interval", "-1s"))

    def test_infinite_interval(self) -> None:
        self.assertIn("poll", command_error("work", "--burst", "--poll-interval", "inf"))

    def test_fractional_interval(self) -> None:
        result = test_tasks.noop_task.enqueue()

        self.run_worker("--poll-interval", "0.1")

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_run_after(self) -> None:
        result = test_tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()

        self.assertEqual(count_jobs(), 1)
        self.assertEqual(count_ready(), 0)

        self.run_worker()

        self.assertEqual(count_jobs(), 1)
        self.assertEqual(count_ready(), 0)
        self.assertEqual(count_successful(), 0)

        with connection.cursor() as c:
            c.execute("UPDATE pgfence.jobs SET run_at = now() WHERE id = %s", (int(result.id),))

        self.assertEqual(count_ready(), 1)

        self.run_worker()

        self.assertEqual(count_ready(), 0)
        self.assertEqual(count_successful(), 1)

    def started_order(self, results: list[Any]) -> list[Any]:
        """``results`` in the order the worker started them."""
        for result in results:
            result.refresh()
        return [r.id for r in sorted(results, key=lambda r: r.started_at)]

    def test_run_after_priority(self) -> None:
        old_task = test_tasks.noop_task.using(priority=20, run_after=timezone.now() - timedelta(hours=2)).enqueue()
        very_old_task = test_tasks.noop_task.using(
            priority=20, run_after=timezone.now() - timedelta(hours=10)).enqueue()
        far_future_result = test_tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
        high_priority_far_future_result = test_tasks.noop_task.using(
            priority=10, run_after=timezone.now() + timedelta(hours=10)).enqueue()
        future_result = test_tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=2)).enqueue()
        high_priority_result = test_tasks.noop_task.using(priority=10).enqueue()
        low_priority_result = test_tasks.noop_task.using(priority=2).enqueue()
        lower_priority_result = test_tasks.noop_task.using(priority=-2).enqueue()

        self.run_worker("--batch", "1")

        ready = [very_old_task, old_task, high_priority_result, low_priority_result, lower_priority_result]
        self.assertEqual(self.started_order(ready), [r.id for r in ready])
        for result in [far_future_result, high_priority_far_future_result, future_result]:
            result.refresh()
            self.assertEqual(result.status, TaskResultStatus.READY)

    def test_verbose_logging(self) -> None:
        result = test_tasks.noop_task.enqueue()

        with self.assertLogs(TASKS_LOGGER, level="INFO") as tasks_logs, \
                self.assertLogs("pgfence", level="INFO") as worker_logs:
            self.run_worker(log_level="INFO")

        self.assertEqual(
            [r.getMessage() for r in tasks_logs.records],
            [
                f"Task id={result.id} path=tasks.noop_task state=RUNNING",
                f"Task id={result.id} path=tasks.noop_task state=SUCCESSFUL",
            ],
        )
        messages = [r.getMessage() for r in worker_logs.records]
        self.assertTrue(any(m.startswith(f"worker {self.worker_id} on queues default") for m in messages), messages)
        self.assertTrue(any(m.startswith(f"worker {self.worker_id} stopped") for m in messages), messages)

    def assert_left_ready(self, job_id: str) -> None:
        self.assertEqual(_scalar("SELECT status FROM pgfence.jobs WHERE id = %s", (int(job_id),)), "queued")

    def test_invalid_task_path(self) -> None:
        job_id = insert_job("subprocess.check_output", [["exit", "1"]])

        self.run_worker()

        self.assert_left_ready(job_id)

    def test_missing_task_path(self) -> None:
        job_id = insert_job("missing.func")

        self.run_worker()

        self.assert_left_ready(job_id)

    def test_worker_doesnt_exit(self) -> None:
        result = test_tasks.exit_task.enqueue()

        self.run_worker()

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, SystemExit)

    def test_worker_with_locked_rows(self) -> None:
        result_1 = test_tasks.noop_task.enqueue()
        other = new_connection()
        try:
            with other.transaction():
                # Lock the first job's row from another session.
                locked = other.execute("SELECT id FROM pgfence.jobs FOR UPDATE").fetchall()
                self.assertEqual(locked, [(int(result_1.id),)])

                # Add another job, which isn't locked.
                result_2 = test_tasks.noop_task.enqueue()

                self.run_worker()
        finally:
            other.close()

        result_1.refresh()
        result_2.refresh()

        self.assertEqual(result_1.status, TaskResultStatus.READY)
        self.assertEqual(result_2.status, TaskResultStatus.SUCCESSFUL)

    def test_max_tasks(self) -> None:
        results = [test_tasks.noop_task.enqueue() for _ in range(5)]

        with self.assertLogs("pgfence", level="INFO") as logs:
            self.run_worker("--max-jobs", "2", "--batch", "1", log_level="INFO")

        self.assertTrue(any(f"worker {self.worker_id} stopped" in line for line in logs.output), logs.output)

        for result in results:
            result.refresh()

        statuses = Counter(result.status for result in results)

        self.assertEqual(statuses[TaskResultStatus.SUCCESSFUL], 2)
        self.assertEqual(statuses[TaskResultStatus.READY], 3)

    def test_takes_context(self) -> None:
        result = test_tasks.get_task_id.enqueue()

        self.run_worker()

        result.refresh()

        self.assertEqual(result.return_value, result.id)

    def test_context(self) -> None:
        result = test_tasks.test_context.enqueue(1)

        self.run_worker()
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_task_import_string(self) -> None:
        job_id = insert_job("tasks.some_test")

        self.run_worker()

        self.assert_left_ready(job_id)


class DatabaseTaskResultTestCase(PgfenceTestCase):
    def test_cross_connection(self) -> None:
        test_tasks.noop_task.enqueue()
        test_tasks.noop_task.enqueue()

        self.assertEqual(count_jobs(), 2)

        self.assertEqual(count_in_new_connection(), 2)


class ClaimOrderTestCase(PgfenceTestCase):
    """DBTaskResultOrderingTestCase: the order pgfence's worker claims jobs in."""

    def run_in_order(self, results: list[Any]) -> list[str]:
        run_worker("--batch", "1")
        for result in results:
            result.refresh()
            self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        return [r.id for r in sorted(results, key=lambda r: r.started_at)]

    def test_higher_priority_tasks_come_first(self) -> None:
        now = timezone.now()
        low = test_tasks.noop_task.using(priority=-1, run_after=now).enqueue()
        normal = test_tasks.noop_task.using(priority=0, run_after=now).enqueue()
        high = test_tasks.noop_task.using(priority=1, run_after=now).enqueue()

        self.assertEqual(self.run_in_order([low, normal, high]), [high.id, normal.id, low.id])

    def test_earlier_run_after_comes_first_given_same_priority(self) -> None:
        now = timezone.now()
        early = test_tasks.noop_task.using(run_after=now - timedelta(hours=2)).enqueue()
        late = test_tasks.noop_task.using(run_after=now).enqueue()
        on_time = test_tasks.noop_task.using(run_after=now - timedelta(hours=1)).enqueue()

        self.assertEqual(self.run_in_order([early, late, on_time]), [early.id, on_time.id, late.id])

    def test_earlier_enqueued_at_comes_first_given_same_priority_and_run_after(self) -> None:
        run_after = timezone.now() - timedelta(hours=1)
        first = test_tasks.noop_task.using(run_after=run_after).enqueue()
        second = test_tasks.noop_task.using(run_after=run_after).enqueue()
        third = test_tasks.noop_task.using(run_after=run_after).enqueue()

        self.assertEqual(self.run_in_order([third, first, second]), [first.id, second.id, third.id])


class Worker:
    """A ``manage.py pgfence`` process, its output read as it comes."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings",
               "PGFENCE_PORT_DB_NAME": connection.settings_dict["NAME"]}
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "pgfence", *argv], cwd=HERE, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        self._reader.join(timeout=DEADLINE if self.process.poll() is not None else 0)
        return "".join(self.lines)

    def wait(self, timeout: float = DEADLINE) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return code

    def started(self) -> bool:
        return any(f"worker {self.name} on queues" in line for line in list(self.lines))


class DatabaseWorkerProcessTestCase(PgfenceTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.workers: list[Worker] = []

    def tearDown(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(DEADLINE)
        super().tearDown()

    def start_worker(self, *args: str, command: str = "work", name: str | None = None,
                     lease: str = "30s") -> Worker:
        name = name or random_name()
        argv = [command, "--log-level", "INFO", "--poll-interval", "0.1s", "--lease", lease, *args]
        if command == "work":
            argv += ["--name", name]
        else:
            argv += ["--metrics-port", "0"]   # no fixed port: runs beside anything else
        worker = Worker(argv, name)
        self.workers.append(worker)
        return worker

    def running(self, result: Any) -> bool:
        result.refresh()
        return result.status == TaskResultStatus.RUNNING

    def test_run_subprocess(self) -> None:
        result = test_tasks.noop_task.enqueue()
        worker = self.start_worker("--burst")
        self.assertEqual(worker.wait(), 0, worker.output)

        self.assertEqual(result.status, TaskResultStatus.READY)

        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_interrupt_no_tasks(self) -> None:
        worker = self.start_worker()
        wait_for(worker.started, what="the worker's start")

        worker.process.terminate()

        self.assertEqual(worker.wait(timeout=5), 0, worker.output)

    def test_interrupt_signals(self) -> None:
        # work drains on either signal; run (the supervisor) drains on
        # SIGTERM, and on SIGINT stops fast: it kills its children and
        # releases their jobs at once, READY for the next worker.
        expected = {("work", signal.SIGINT): TaskResultStatus.SUCCESSFUL,
                    ("work", signal.SIGTERM): TaskResultStatus.SUCCESSFUL,
                    ("run", signal.SIGINT): TaskResultStatus.READY,
                    ("run", signal.SIGTERM): TaskResultStatus.SUCCESSFUL}
        for command in ["work", "run"]:
            for sig in [signal.SIGINT, signal.SIGTERM]:
                with self.subTest(command=command, sig=sig):
                    result = test_tasks.sleep_for.enqueue(2)
                    self.assertEqual(default_task_backend.get_result(result.id).worker_ids, [])

                    extra = ["--workers", "1"] if command == "run" else []
                    worker = self.start_worker(*extra, command=command)

                    wait_for(lambda: self.running(result), what="the task's start", worker=worker)  # noqa: B023
                    self.assertNotEqual(result.worker_ids, [])

                    worker.process.send_signal(sig)

                    self.assertEqual(worker.wait(timeout=10), 0, worker.output)

                    result.refresh()

                    self.assertEqual(result.status, expected[command, sig])
                    reset_pgfence()

    def test_repeat_ctrl_c(self) -> None:
        # The task's attempt is interrupted by the second ^C: a reclaim is
        # then due, which fails a job on its last attempt; this one has three.
        with override_settings(TASKS={"default": {**settings.TASKS["default"],
                                                  "OPTIONS": {**OPTIONS, "MAX_ATTEMPTS": 3}}}):
            result = test_tasks.sleep_for.enqueue(30)
        self.assertEqual(default_task_backend.get_result(result.id).worker_ids, [])

        worker = self.start_worker(lease="2s")

        wait_for(lambda: self.running(result), what="the task's start", worker=worker)
        self.assertEqual(result.worker_ids, [worker.name])

        worker.process.send_signal(signal.SIGINT)

        # The first ^C drains: once the worker says it is stopping, it stays, and so does its task.
        wait_for(lambda: "stopping: it finishes its running jobs" in worker.output, what="the first ^C",
                 worker=worker)
        self.assertIsNone(worker.process.poll(), worker.output)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.RUNNING)
        self.assertEqual(result.worker_ids, [worker.name])

        worker.process.send_signal(signal.SIGINT)

        # The second stops the worker at once (the task sleeps for 30 s): it
        # says so and exits 130.  The interrupt is the worker's, not an error
        # of the task: the attempt records no error.
        self.assertEqual(worker.wait(timeout=5), 130, worker.output)
        self.assertIn("pgfence: interrupted", worker.output)
        result.refresh()
        self.assertEqual((result.status, result.errors), (TaskResultStatus.RUNNING, []))

        # Not stuck RUNNING: once its lease runs out, another worker takes it.
        second = self.start_worker(lease="40s")
        wait_for(lambda: self.running(result) and len(result.worker_ids) == 2, what="the reclaim",
                 worker=second)
        self.assertEqual(result.worker_ids, [worker.name, second.name])
        second.process.kill()

    def test_kill(self) -> None:
        # A reclaim on the job's last attempt fails it: this one has three.
        with override_settings(TASKS={"default": {**settings.TASKS["default"],
                                                  "OPTIONS": {**OPTIONS, "MAX_ATTEMPTS": 3}}}):
            result = test_tasks.sleep_for.enqueue(1)

        first = self.start_worker(lease="2s")

        wait_for(lambda: self.running(result), what="the task's start", worker=first)

        first.process.kill()

        self.assertEqual(first.wait(timeout=5), -signal.SIGKILL)

        # Not stuck RUNNING: once its lease runs out, a second worker takes it.
        second = self.start_worker(lease="2s")

        def settled() -> bool:
            result.refresh()
            return result.status == TaskResultStatus.SUCCESSFUL

        wait_for(settled, what="the killed worker's task to be reclaimed and run", worker=second)
        self.assertEqual(result.attempts, 2)
        self.assertEqual(result.worker_ids, [first.name, second.name])
        second.process.terminate()
        self.assertEqual(second.wait(), 0, second.output)

    def test_system_exit_task(self) -> None:
        result = test_tasks.failing_task_system_exit.enqueue()

        worker = self.start_worker("--burst")
        self.assertEqual(worker.wait(), 0, worker.output)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, SystemExit)

    def test_keyboard_interrupt_task(self) -> None:
        result = test_tasks.failing_task_keyboard_interrupt.enqueue()

        worker = self.start_worker("--burst")
        self.assertEqual(worker.wait(), 0, worker.output)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, KeyboardInterrupt)

    def test_multiple_workers(self) -> None:
        results = [test_tasks.sleep_for.enqueue(0.1) for _ in range(10)]

        workers = [self.start_worker("--burst") for _ in range(3)]

        for worker in workers:
            self.assertEqual(worker.wait(), 0, worker.output)

        for result in results:
            result.refresh()
            self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

        all_output = ""
        for worker in workers:
            all_output += worker.output
            self.assertIn(f"worker {worker.name} stopped", worker.output)

        for result in results:
            # Running and successful, each once.
            self.assertEqual(all_output.count(f"Task id={result.id} "), 2, all_output)


class CompatTestCase(SimpleTestCase):
    def test_compat_has_django_task(self) -> None:
        self.assertIn(Task, compat.task_classes())

        if django.VERSION >= (6, 0):
            from django.tasks.base import Task as DjangoTask

            self.assertIn(DjangoTask, compat.task_classes())

