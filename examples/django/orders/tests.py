"""The example shop's tests: its tasks on pgfence, run by real
``manage.py pgfence run`` supervisors against Django's test database.

Run them with Django's test runner (a PostgreSQL server named by
PGFENCE_DSN, default the local one)::

    python manage.py test orders
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from django.core import checks
from django.db import connection, transaction
from django.test import TransactionTestCase, override_settings

from orders import tasks
from pgfence.contrib.django import backend
from orders.models import Order

try:
    from django.tasks import TaskResultStatus, default_task_backend
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
except ImportError:
    from django_tasks import TaskResultStatus, default_task_backend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist

HERE = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> Any:
    """Poll ``condition`` until it is truthy (its value) or the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def rows(sql: str, params: tuple = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def test_dsn(password: str | None = None) -> str:
    """The test database's DSN, for a manage.py in another process."""
    settings = connection.settings_dict
    dsn = f"dbname={settings['NAME']} host={settings['HOST'] or '127.0.0.1'} user={settings['USER']}"
    if settings["PORT"]:
        dsn += f" port={settings['PORT']}"
    return dsn + (f" password={password}" if password else "")


class Supervisor:
    """A real ``manage.py pgfence run`` on the test database."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        dsn = test_dsn()
        self.metrics = Path(tempfile.mkdtemp(prefix="shop-metrics-"))
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed with the supervisor
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "pgfence", "run", "--workers", "1", "--metrics-port", "0",
             "--metrics-dir", str(self.metrics), "--poll-interval", "0.2s", *args],
            cwd=HERE, env={**os.environ, "PGFENCE_DSN": dsn, **(env or {})}, stdout=self.log, stderr=self.log)

    def child(self) -> int:
        """The pid of the supervisor's one worker child."""
        def found() -> int | None:
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except FileNotFoundError:
                return None
            for pid in children:
                if "worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return int(pid)
            return None
        return wait_for(found, what="the worker child")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the supervisor did not stop on TERM:\n{self.output()}") from None

    def double_runs_prevented(self) -> float:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.metrics))
        return sum(s.value for family in registry.collect() for s in family.samples
                   if s.name == "pgfence_double_run_prevented_total")


class ShopTasks(TransactionTestCase):
    def setUp(self) -> None:
        self.supervisors: list[Supervisor] = []
        # Django flushes its own tables between tests, not pgfence's.
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgfence.jobs, pgfence.job_history, pgfence.job_attempts")

    def tearDown(self) -> None:
        for supervisor in self.supervisors:
            if supervisor.proc.poll() is None:
                supervisor.proc.kill()
                supervisor.proc.wait()

    def start(self, *args: str, env: dict[str, str] | None = None) -> Supervisor:
        supervisor = Supervisor(*args, env=env)
        self.supervisors.append(supervisor)
        return supervisor

    def finished(self, result: Any) -> Any:
        def done() -> bool:
            result.refresh()
            return result.is_finished
        try:
            wait_for(done, what=f"task {result.id} to finish")
        except AssertionError:
            raise AssertionError(f"task {result.id} did not finish; the supervisors said:\n"
                                 + "\n".join(s.output() for s in self.supervisors)) from None
        return result

    def test_a_task_enqueued_in_a_rolled_back_atomic_block_leaves_no_job(self) -> None:
        with self.assertRaises(RuntimeError), transaction.atomic():
            order = Order.objects.create(reference="A-1", total_cents=1200)
            tasks.ship.enqueue(order.pk)
            raise RuntimeError("payment declined")
        self.assertEqual(rows("SELECT count(*) FROM pgfence.all_jobs"), [(0,)])
        self.assertEqual(Order.objects.count(), 0)

    def test_a_committed_task_runs_and_its_result_is_successful_with_its_return_value(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(reference="A-2", total_cents=1200)
            result = tasks.ship.enqueue(order.pk)
        self.assertEqual(result.status, TaskResultStatus.READY)
        supervisor = self.start()
        self.finished(result)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, {"order": order.pk, "label": f"label-{order.pk}"})
        self.assertEqual((result.attempts, result.errors), (1, []))
        self.assertEqual(rows("SELECT label, attempt FROM orders_shipment"), [(f"label-{order.pk}", 1)])
        self.assertEqual(supervisor.stop(), 0)

    def test_a_raising_task_fails_after_its_attempts_with_each_errors_class_path_and_traceback(self) -> None:
        result = tasks.declined.enqueue(7)
        self.start("--backoff-base", "0.1s", "--backoff-max", "0.2s")
        self.finished(result)
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.attempts, 3)   # MAX_ATTEMPTS of the settings
        self.assertEqual([e.exception_class_path for e in result.errors], ["builtins.ValueError"] * 3)
        self.assertEqual([e.exception_class for e in result.errors], [ValueError] * 3)
        for error in result.errors:
            self.assertTrue(error.traceback.startswith("Traceback (most recent call last):\n"), error.traceback)
            self.assertIn('orders/tasks.py", line', error.traceback)
            self.assertTrue(error.traceback.endswith("ValueError: card declined for order 7\n"), error.traceback)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018

    def test_priority_order_and_run_after_hold(self) -> None:
        later = tasks.log_reference.using(run_after=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2))
        delayed = later.enqueue("delayed")
        low = tasks.log_reference.using(priority=-5).enqueue("low")
        high = tasks.log_reference.using(priority=50).enqueue("high")
        middle = tasks.log_reference.enqueue("middle")
        supervisor = self.start()
        for result in (low, high, middle):
            self.finished(result)
        self.assertEqual(sorted([low, high, middle], key=lambda r: r.started_at), [high, middle, low])
        delayed.refresh()
        self.assertEqual(delayed.status, TaskResultStatus.READY)
        self.finished(delayed)
        self.assertGreaterEqual(delayed.started_at, later.run_after)
        self.assertEqual(delayed.return_value, "delayed")
        self.assertEqual(supervisor.stop(), 0)

    def test_an_async_task_runs_on_the_loop_and_reads_the_orm(self) -> None:
        Order.objects.create(reference="A-3", total_cents=100)
        result = tasks.count_orders_later.enqueue(0.05)
        context = tasks.attempt_number.enqueue()
        supervisor = self.start()
        self.finished(result)
        self.finished(context)
        self.assertEqual((result.status, result.return_value), (TaskResultStatus.SUCCESSFUL, 1))
        self.assertEqual(context.return_value, 1)
        self.assertEqual(supervisor.stop(), 0)

    def test_a_stale_attempt_after_sigstop_leaves_one_order_and_is_counted_as_a_double_run_prevented(self) -> None:
        result = tasks.import_order.enqueue("P-1", 4200)
        # A: its partner call lasts 3 s; the lease is 1 s, and A is stopped.
        slow = self.start("--lease", "1s", "--lost-lease-kill-after", "120s",
                          env={"SHOP_PARTNER_PAUSE": "3"})
        child = slow.child()
        wait_for(lambda: rows("SELECT attempt FROM pgfence.jobs WHERE status = 'running'") == [(1,)],
                 what="A to run the task")
        os.kill(child, signal.SIGSTOP)
        try:
            fast = self.start("--lease", "5s")
            self.finished(result)
            self.assertEqual((result.status, result.attempts), (TaskResultStatus.SUCCESSFUL, 2))
        finally:
            os.kill(child, signal.SIGCONT)
        # A wakes, finishes its partner call, and its fenced block is refused.
        wait_for(lambda: rows("SELECT outcome FROM pgfence.job_attempts WHERE attempt = 1 "
                              "AND outcome = 'fence_rejected'"), what="A's refused completion")
        self.assertEqual(list(Order.objects.values_list("reference", "total_cents")), [("P-1", 4200)])
        self.assertEqual(result.return_value, Order.objects.get().pk)
        self.assertEqual(sorted(rows("SELECT attempt, outcome FROM pgfence.job_attempts")),
                         [(1, "fence_rejected"), (1, "lease_lost")])
        self.assertEqual(slow.stop(), 0)
        self.assertEqual(fast.stop(), 0)
        self.assertEqual(slow.double_runs_prevented(), 1.0)
        self.assertEqual(fast.double_runs_prevented(), 0.0)

    def test_a_task_is_running_until_its_result_is_written_after_its_fenced_block(self) -> None:
        result = tasks.import_order_then_report.enqueue("R-1", 990, 2.0)
        supervisor = self.start()
        # The fenced block committed the order and the job's completion; the
        # task has not returned, so its result is not there yet.
        wait_for(lambda: Order.objects.filter(reference="R-1").exists(), what="the fenced block's commit")
        self.assertEqual(rows("SELECT status, result IS NULL FROM pgfence.all_jobs"), [("done", True)])
        result.refresh()
        self.assertEqual((result.status, result.finished_at), (TaskResultStatus.RUNNING, None))
        # Had the worker stopped between the two writes, the result would be
        # lost: after the grace the task is shown done, without one.
        with mock.patch.object(backend, "RESULT_GRACE", 0.0):
            result.refresh()
        self.assertEqual((result.status, result.return_value), (TaskResultStatus.SUCCESSFUL, None))
        wait_for(lambda: rows("SELECT result IS NOT NULL FROM pgfence.all_jobs") == [(True,)],
                 what="the task's result")
        result.refresh()
        self.assertEqual((result.status, result.return_value), (TaskResultStatus.SUCCESSFUL, Order.objects.get().pk))
        self.assertEqual(supervisor.stop(), 0)

    def test_a_task_returning_none_stores_json_null(self) -> None:
        result = tasks.noop.enqueue()
        supervisor = self.start()
        self.finished(result)
        self.assertEqual((result.status, result.return_value), (TaskResultStatus.SUCCESSFUL, None))
        self.assertEqual(rows("SELECT result::text FROM pgfence.all_jobs"), [("null",)])
        self.assertEqual(supervisor.stop(), 0)

    def test_arguments_json_cannot_carry_are_refused_before_anything_is_written(self) -> None:
        with self.assertRaises(TypeError):
            tasks.log_reference.enqueue(dt.datetime.now(dt.UTC))
        with self.assertRaises(TypeError):
            tasks.log_reference.enqueue(reference={1, 2})
        self.assertEqual(rows("SELECT count(*) FROM pgfence.all_jobs"), [(0,)])
        # Django's normalisation: a tuple is stored (and read back) as a list.
        result = tasks.log_reference.enqueue(("a", "b"))
        self.assertEqual(result.args, [["a", "b"]])
        self.assertEqual(default_task_backend.get_result(result.id).args, [["a", "b"]])

    def test_unknown_and_invalid_ids_raise_task_result_does_not_exist(self) -> None:
        for result_id in ("999999", "abc", "0", "-3", "1.5", ""):
            with self.subTest(result_id), self.assertRaises(TaskResultDoesNotExist):
                default_task_backend.get_result(result_id)

    def test_a_queue_pgfence_cannot_serve_is_refused_by_validation_and_reported_by_check(self) -> None:
        with override_settings(TASKS={"default": {"BACKEND": "pgfence.contrib.django.PgfenceBackend",
                                                  "QUEUES": ["bad queue", "default"]}}):
            from orders.tasks import noop

            with self.assertRaisesMessage(InvalidTask, "invalid queue name 'bad queue'"):
                noop.using(queue_name="bad queue").enqueue()
            found = [m.id for m in default_task_backend.check()]
        self.assertEqual(found, ["pgfence.E003"])
        self.assertEqual(rows("SELECT count(*) FROM pgfence.all_jobs"), [(0,)])

    def test_check_reports_a_database_that_is_not_postgresql(self) -> None:
        databases = {"default": connection.settings_dict, "other": {"ENGINE": "django.db.backends.sqlite3",
                                                                    "NAME": ":memory:"}}
        with override_settings(DATABASES=databases,
                               TASKS={"default": {"BACKEND": "pgfence.contrib.django.PgfenceBackend",
                                                  "OPTIONS": {"DATABASE": "missing"}}}):
            messages = list(default_task_backend.check())
        self.assertEqual([(m.level, m.id) for m in messages], [(checks.ERROR, "pgfence.E001")])
        self.assertIn("no alias 'missing'", messages[0].msg)

    def test_connections_stay_flat_over_ten_thousand_tasks(self) -> None:
        def connections_now() -> tuple[int, set[str]]:
            """Django's connections (no application name) and pgfence's own."""
            found = rows("SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                         "AND pid <> pg_backend_pid()")
            return (sum(1 for (name,) in found if not name),
                    {name.split(" vm")[0].split(" ")[1] if name.startswith("pgfence worker") else name
                     for (name,) in found if name})

        def drained() -> bool:
            return rows("SELECT count(*) FROM pgfence.jobs") == [(0,)]

        first = [tasks.noop.enqueue() for _ in range(1_000)]
        supervisor = self.start("--workers", "2", "--threads", "4")
        self.finished(first[-1])
        wait_for(drained, what="the first thousand")
        django_first, _ = connections_now()
        # One per worker thread: 2 children of 4 threads, kept between tasks.
        self.assertEqual(django_first, 8)
        for _ in range(9):
            batch = [tasks.noop.enqueue() for _ in range(1_000)]
            self.finished(batch[-1])
            wait_for(drained, what="a thousand more")
            django_now, pgfence_now = connections_now()
            self.assertEqual(django_now, django_first)
            # pgfence's own: the workers' and the services', opened once each.
            self.assertLessEqual(pgfence_now, {"worker", "pgfence heartbeat", "pgfence presence", "pgfence vacuum"})
        self.assertEqual(rows("SELECT status, count(*) FROM pgfence.job_history GROUP BY status"), [("done", 10_000)])
        self.assertEqual(supervisor.stop(), 0)
        wait_for(lambda: connections_now() == (0, set()), what="the supervisor's connections to close")

    def test_a_forked_child_forgets_the_parents_connection_without_ending_its_session(self) -> None:
        from django.db import connections

        from pgfence.contrib.django.connection import drop_inherited

        parent_backend = rows("SELECT pg_backend_pid()")[0][0]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: forget, then open its own connection
            code = 1
            try:
                drop_inherited()
                os.write(write, str(rows("SELECT pg_backend_pid()")[0][0]).encode())
                connections.close_all()     # as close_old_connections() after a task
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        child_backend = int(os.read(read, 64).decode() or 0)
        os.close(read)
        self.assertEqual(os.waitpid(pid, 0)[1], 0)
        self.assertNotIn(child_backend, (0, parent_backend))
        # The parent's session is untouched: same backend, still answering.
        self.assertEqual(rows("SELECT pg_backend_pid()")[0][0], parent_backend)

    def test_manage_py_pgfence_uses_the_projects_database_and_never_shows_its_password(self) -> None:
        secret = "s3cret-Pa55"   # the server trusts loopback: the password is carried, never asked for
        env = {**os.environ, "PGFENCE_DSN": test_dsn(secret)}
        tasks.noop.enqueue()
        status = subprocess.run([sys.executable, "manage.py", "pgfence", "status"], cwd=HERE, env=env,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("queued", status.stdout)
        shown = subprocess.run([sys.executable, "manage.py", "pgfence", "dsn"], cwd=HERE, env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn(f"dbname={connection.settings_dict['NAME']}", shown.stdout)
        bad = subprocess.run([sys.executable, "manage.py", "pgfence", "work", "--lease", "-1"], cwd=HERE, env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual((bad.returncode, bad.stdout), (2, ""))
        self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
        self.assertIn("invalid lease", bad.stderr)
        supervisor = self.start(env={"PGFENCE_DSN": test_dsn(secret)})
        child = supervisor.child()
        titles = [Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                  for pid in (supervisor.proc.pid, child)]
        self.assertEqual(supervisor.stop(), 0)
        for text in (status.stdout, status.stderr, shown.stdout, shown.stderr, bad.stderr, supervisor.output(),
                     *titles):
            self.assertNotIn(secret, text)
