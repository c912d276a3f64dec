"""Bulk actions in the background: retry, cancel or delete every job that
matches a filter, however many, without holding an HTTP request open.

The dashboard's POST only records the action (a row of
``pgfence.bulk_actions``, migration 0013) and answers 303 to its page.  A
*runner* does the work, one batch per transaction:

1. lock the action's row (``FOR UPDATE``), and go on only if this runner
   still owns it and it still runs (a cancel, or another runner that took
   it over, ends it here);
2. the first step counts the jobs it matches (up to the id the
   confirmation counted); each next step reads the next ``batch`` matching
   jobs below the cursor, newest first, and acts on them with the
   statements of ``pgfence retry``, ``pgfence cancel`` and the dashboard's
   delete, which lock those jobs in id order;
3. move the cursor and add the counts, in the same transaction.

So the progress the page shows is exact, and a batch is done entirely or
not at all: a runner that takes over after another died starts where the
last committed batch ended, and no job is acted on twice.  A batch holds
its action's row and at most ``batch`` jobs, for one short transaction:
claims skip the jobs it holds (their ``SKIP LOCKED``), a renewal or a
completion of a running job being cancelled waits for that transaction
only, and a batch that waits more than ``LOCK_MS`` for a job another
transaction holds gives up, rolls back, and is tried again.

After each batch the runner rests as long as the batch took (``REST``):
an action over a million jobs takes about twice as long, and the workers'
claims and completions, whose commits wait for the same WAL flushes as the
batches', keep most of the database.

**Where the runner lives: in the dashboard's process**, a thread with one
connection of its own (a :class:`pgfence.background.Service`), started with
the dashboard (by ``pgfence web`` before it listens; mounted in another
application, at the first request, as the pool is) and stopped by
:meth:`pgfence.web.dashboard.Dashboard.close`.  Not in ``pgfence run``: a
bulk action is the dashboard's, and it runs where the dashboard runs, with
or without workers on that host, and without adding work to the process
that renews the workers' leases.  A read-only dashboard runs none.

**Owner and lease.**  A runner claims an action by writing its name, its
session's backend pid and a lease (``LEASE`` seconds, renewed by every
batch); it runs one action at a time, oldest first.  Another runner (a
second dashboard process, or this one restarted) takes an action over when
its owner's lease ran out or its owner's database session is gone (the
process died: no need to wait for the lease), and never while a batch
holds the row (``SKIP LOCKED``).  Because every batch checks ownership
with the row locked, two runners never run one action at once.  A runner
that stops cleanly gives its actions up, for the next one to take at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from pgfence import identity
from pgfence.background import Service
from pgfence.store import bulk as store
from pgfence.store import db
from pgfence.store import web as web_store
from pgfence.web import actions
from pgfence.web.present import parse_filter

log = logging.getLogger("pgfence.web")

#: Jobs per transaction of a bulk action.
BATCH = 500
#: Seconds an action stays its runner's without a batch committed.  Above
#: the longest statement of a step (the count, bounded by STATEMENT_MS).
LEASE = 60.0
#: Seconds between looks for an action to run, when idle (a new action of
#: this dashboard wakes its runner at once).
IDLE = 2.0
#: After each batch, the runner rests this many times as long as the batch
#: took: it works half the time at most, and leaves the database's CPU and
#: WAL flushes to the workers meanwhile (bench/README.md, "Bulk retry of a
#: million jobs from the dashboard": the claim latency of a steady stream,
#: back to back and resting).
REST = 1.0
#: A runner's statement timeout, and the longest it waits for a job's lock.
STATEMENT_MS = 60_000
LOCK_MS = 5_000

#: What a step did.
IDLE_STEP, COUNTED, BATCHED, FINISHED, LOST = "idle", "counted", "batch", "finished", "lost"


class BulkRunner(Service[str]):
    """Runs the bulk actions, a batch per step, on a thread of its own."""

    thread_name = "pgfence-web-bulk"
    application_name = "pgfence-web-bulk"
    failure = "bulk action batch failed, tried again"

    def __init__(self, dsn: str, *, lease: float = LEASE, idle: float = IDLE, rest: float = REST) -> None:
        super().__init__(dsn, interval=idle, log=log)
        self.lease = lease
        self.rest = rest
        #: Seconds the last step took.
        self.last_step = 0.0
        #: This runner's name, as the actions it holds record it.
        self.owner = identity.process_name()
        #: The action it runs now.
        self.current: int | None = None
        #: Whether it ever held an action (what a stop gives up).
        self.claimed = False

    def connected(self, conn: psycopg.Connection[Any]) -> None:
        store.session(conn, statement_ms=STATEMENT_MS, lock_ms=LOCK_MS)

    def run_once(self) -> str:
        conn = self.connection()
        if self.current is None:
            with db.translated():
                self.current = store.claim(conn, owner=self.owner, lease=self.lease)
            if self.current is None:
                return IDLE_STEP
            self.claimed = True
        began = time.monotonic()
        try:
            return self._step(conn, self.current)
        except Exception as exc:
            self._note_error(conn, self.current, exc)
            raise
        finally:
            self.last_step = time.monotonic() - began

    def wait_after(self, result: str) -> float:
        # Batch after batch without a pause; a look again at once after an
        # action ended or was lost (another may wait).
        if result == IDLE_STEP:
            return self.interval
        return self.rest * self.last_step if result == BATCHED else 0.0

    def retry_wait(self, failures: int) -> float:
        return min(self.interval * failures, 30.0)

    def _step(self, conn: psycopg.Connection[Any], action_id: int) -> str:
        with db.translated(), conn.transaction():
            action = store.lock(conn, action_id, owner=self.owner)
            if action is None:
                self.current = None
                return LOST
            where, problems = parse_filter(action.filter)
            if problems:
                raise ValueError(f"bulk action {action_id}: bad filter: {'; '.join(problems)}")
            statuses = list(actions.ELIGIBLE[action.action])
            if action.matched is None:
                matched, _top = web_store.jobs_count(conn, where, statuses, upto=action.upto)
                store.counted(conn, action_id, owner=self.owner, matched=matched, lease=self.lease)
                return COUNTED
            rows = web_store.jobs_page(conn, where, before=action.cursor, upto=action.upto, limit=action.batch,
                                       statuses=statuses)
            ids = [row.id for row in rows]
            outcome = actions.act(conn, action.action, ids) if ids else actions.Outcome(acted=[], skipped=[])
            finished = len(ids) < action.batch
            store.progress(conn, action_id, owner=self.owner, cursor=ids[-1] if ids else None,
                           acted=len(outcome.acted), left_alone=len(outcome.skipped), batches=1 if ids else 0,
                           finished=finished, lease=self.lease)
        if finished:
            self.current = None
            return FINISHED
        return BATCHED

    def _note_error(self, conn: psycopg.Connection[Any], action_id: int, exc: Exception) -> None:
        """Show a failed batch's error on the action's page (best effort:
        the connection may be the reason)."""
        try:
            with db.translated():
                store.note_error(conn, action_id, owner=self.owner,
                                 error=db.scrub(db.first_line(exc), self.dsn)[:500])
        except Exception:  # noqa: BLE001 - the step's own error is what is logged
            pass

    def stop(self) -> None:
        """End the thread and give up the actions this runner holds (the
        next runner takes them at once); a thread still in a step keeps
        them, until its lease runs out."""
        self.halt()
        if self.running:
            return
        if not self.claimed:
            self.close()
            return
        try:
            with db.translated():
                store.release(self.connection(), owner=self.owner)
        except Exception as exc:  # noqa: BLE001 - the lease runs out on its own
            log.warning("bulk actions not released: %s", db.scrub(db.first_line(exc), self.dsn))
        finally:
            self.current = None
            self.claimed = False
            self.close()


def begin(conn: psycopg.Connection[Any], *, action: str, fields: dict[str, str], upto: int, batch: int,
          by: str) -> int:
    """Record a bulk action for a runner to take; its id.  ``fields`` is
    the filter as the pages show it (``present.filter_fields``)."""
    if action not in actions.ELIGIBLE:
        raise ValueError(f"unknown action {action!r}")
    with db.translated():
        return store.create(conn, action=action, fields=fields, upto=upto, batch=batch, by=by)
