"""The metrics server: a small child process of the arbiter.

It serves, on the socket the arbiter bound before any fork:

- ``/metrics``: every process's metrics summed (prometheus_client's
  multiprocess collector over the shared directory);
- ``/healthz``: 200 while the arbiter's loop ticks (a liveness probe that a
  busy worker can never fail);
- ``/readyz``: 200 when the database answers and the workers are up.

It also refreshes the ``pgfence_queue_*`` gauges, the vacuum ones
(:mod:`pgfence.observe.vacuum`) and the concurrency and rate limits' ones
(:mod:`pgfence.observe.limits`) at an interval, so that one process, not
every scrape of every child, counts the jobs table.  Serving
from a child keeps the arbiter free of threads.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pgfence.store import admin, db, operations
from pgfence.store import limits as limits_store
from pgfence.observe.collect import TolerantCollector
from pgfence.store.vacuum import vacuum_stats
from pgfence.observe import metrics
from pgfence.observe.limits import LimitGauges
from pgfence.observe.vacuum import VacuumWatch
from pgfence.prefork import proctitle
from pgfence.prefork.slots import SlotTable
from pgfence.settings import Settings

T = TypeVar("T")

log = logging.getLogger("pgfence.metrics")

#: The arbiter's loop ticks every half second; this much silence is unhealthy.
HEALTHY_WITHIN = 10.0
#: Seconds between refreshes of the queue gauges.
QUEUE_REFRESH = 15.0


class MetricsServer:
    def __init__(self, sock: socket.socket, dsn: str, table: SlotTable, liveness: float,
                 queue_refresh: float = QUEUE_REFRESH, settings: Settings | None = None):
        self.sock = sock
        self.dsn = dsn
        self.table = table
        self.liveness = liveness
        self.queue_refresh = queue_refresh
        self._conn: psycopg.Connection[Any] | None = None
        self._db_lock = threading.Lock()
        self._stop = threading.Event()
        self._seen: set[tuple[str, str]] = set()
        self._queues: set[str] = set()
        self._paused_known: set[str] = set()
        settings = settings or Settings()
        #: The queues this supervisor serves (their paused gauge reads 0 from the start).
        self.served = tuple(settings.queues)
        self.vacuum = VacuumWatch(settings.vacuum_warn_dead_tuples, settings.vacuum_warn_horizon)
        self.limits = LimitGauges()
        #: One collector for every scrape (it reads the files afresh each
        #: time), so that a bad file is logged once, not at every scrape.
        self.registry = CollectorRegistry()
        TolerantCollector(self.registry)

    # -- checks ------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        alive_at = self.table.arbiter_state().alive_at
        age = time.monotonic() - alive_at
        if alive_at and age <= HEALTHY_WITHIN:
            return True, "ok"
        return False, f"arbiter loop silent for {age:.0f}s"

    def ready(self) -> tuple[bool, str]:
        ok, why = self.healthy()
        if not ok:
            return ok, why
        target = self.table.arbiter_state().target
        up = self.table.workers_up(self.liveness)
        if up < target:
            return False, f"{up} of {target} workers up"
        try:
            self._query(lambda conn: conn.execute("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            return False, f"database: {db.first_line(exc)}"
        return True, f"{up} workers up, database answers"

    def _query(self, run: Callable[[psycopg.Connection], T]) -> T:
        """``run(conn)`` on this server's connection, opened on first use
        and dropped after any failure."""
        with self._db_lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = db.connect(self.dsn, application_name="pgfence metrics")
                return run(self._conn)
            except Exception:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                raise

    # -- queue gauges ---------------------------------------------------------------

    def refresh_queues(self) -> int:
        """Set the queue gauges from one query (and the paused gauge from
        another); return the rows read."""
        rows = self._query(admin.queue_gauges)
        paused = {p.queue for p in self._query(operations.pauses)}
        seen = set()
        oldest: dict[str, float] = {}
        for row in rows:
            metrics.QUEUE_JOBS.labels(row.queue, row.status).set(row.jobs)
            seen.add((row.queue, row.status))
            oldest[row.queue] = max(oldest.get(row.queue, 0.0), row.oldest_age)
        # A status that emptied since the last refresh reads 0, not its old value.
        for queue, status in self._seen - seen:
            metrics.QUEUE_JOBS.labels(queue, status).set(0)
        self._seen |= seen
        self._queues |= set(oldest)
        for queue in self._queues:
            metrics.QUEUE_OLDEST_AGE.labels(queue).set(oldest.get(queue, 0.0))
        # Every queue served, seen or paused reads 1 or 0: a resumed queue
        # drops back to 0 rather than keep its old value.
        self._paused_known |= set(self.served) | self._queues | paused
        for queue in self._paused_known:
            metrics.QUEUE_PAUSED.labels(queue).set(1 if queue in paused else 0)
        return len(rows)

    def refresh_vacuum(self) -> list[str]:
        """Set the vacuum gauges from one query; return the warnings logged."""
        return self.vacuum.observe(self._query(vacuum_stats), time.monotonic())

    def refresh_limits(self) -> int:
        """Set the concurrency limits' gauges from one query; return the
        kinds with limits."""
        return self.limits.observe(self._query(limits_store.list_limits))

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            for refresh, what in ((self.refresh_queues, "queue"), (self.refresh_vacuum, "vacuum"),
                                  (self.refresh_limits, "limits")):
                try:
                    refresh()
                except Exception as exc:  # noqa: BLE001 - the next round tries again
                    log.warning("%s gauges not refreshed: %s", what, db.first_line(exc))
            self._stop.wait(self.queue_refresh)

    # -- HTTP ----------------------------------------------------------------------------

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, why = server.healthy() if path == "/healthz" else server.ready()
                    self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def serve(self) -> None:
        httpd = ThreadingHTTPServer(self.sock.getsockname()[:2], self.handler_class(), bind_and_activate=False)
        httpd.socket.close()
        httpd.socket = self.sock
        httpd.daemon_threads = True
        threading.Thread(target=self._refresh_loop, name="pgfence-queue-gauges", daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
        # TERM was blocked across the fork; with the handler set it may come.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
        try:
            httpd.serve_forever(poll_interval=0.25)
        finally:
            self._stop.set()


def main(sock: socket.socket, dsn: str, table: SlotTable, liveness: float, settings: Settings) -> int:
    parent = os.getppid()
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)
    host, port = sock.getsockname()[:2]
    proctitle.set(f"pgfence metrics {host}:{port}")
    server = MetricsServer(sock, dsn, table, liveness, settings=settings)
    proctitle.die_with_parent(parent)
    server.serve()
    return 0
