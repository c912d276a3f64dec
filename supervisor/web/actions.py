"""What the dashboard's buttons do to jobs: retry, cancel and delete one job
or a selection, at once, and the batch of a bulk action (every job matching
a filter), which :mod:`pgfence.web.bulk` runs in the background.  Retry and
cancel are the statements of ``pgfence retry`` and ``pgfence cancel``; each
batch is its own short transaction, so an action over a million jobs never
holds a million row locks, and what it did before an error stays done."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import psycopg

from pgfence import client
from pgfence.store import db
from pgfence.store import web as store

#: Jobs per transaction of a selection.
BATCH = 500

#: The actions on jobs, and the statuses each applies to.
ELIGIBLE: dict[str, tuple[str, ...]] = {
    "retry": ("failed", "cancelled"),
    "cancel": ("queued", "running"),
    # Never a running job: its worker owns it.
    "delete": ("queued", "done", "failed", "cancelled"),
}

#: The past tense of each action, for the message after it.
DONE = {"retry": "retried", "cancel": "cancelled", "delete": "deleted"}

#: Lends a connection for one batch (a pool's ``connection``).
Connections = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class Outcome(NamedTuple):
    """What an action did: the ids it acted on, and those it left alone
    (a retry whose dedupe key a live job holds; a job whose status changed
    meanwhile)."""

    acted: list[int]
    skipped: list[int]


def act(conn: psycopg.Connection[Any], action: str, ids: list[int]) -> Outcome:
    """Apply ``action`` to the jobs ``ids`` in one transaction (a savepoint
    of the caller's, when one is open)."""
    if action not in ELIGIBLE:
        raise ValueError(f"unknown action {action!r}")
    if action == "retry":
        result = client.retry(conn, ids)
        acted = result.requeued
    elif action == "cancel":
        acted = client.cancel(conn, ids)
    else:
        with db.translated(), conn.transaction():
            acted = store.delete_ids(conn, ids)
    done = set(acted)
    return Outcome(acted=sorted(done), skipped=sorted(set(ids) - done))


def _chunks(ids: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


def act_on_ids(connections: Connections, action: str, ids: list[int], batch: int = BATCH) -> Outcome:
    """Apply ``action`` to the selected jobs ``ids``, ``batch`` at a time."""
    acted: list[int] = []
    skipped: list[int] = []
    for chunk in _chunks(sorted(set(ids)), batch):
        with connections() as conn:
            outcome = act(conn, action, chunk)
        acted += outcome.acted
        skipped += outcome.skipped
    return Outcome(acted=acted, skipped=skipped)


def message(action: str, outcome: Outcome) -> str:
    """The line shown after an action."""
    text = f"{DONE[action]} {len(outcome.acted)} job(s)"
    if outcome.skipped:
        reason = {"retry": "not failed or cancelled any more, or a live job holds its dedupe key",
                  "cancel": "not queued or running any more",
                  "delete": "running, or gone"}[action]
        text += f"; {len(outcome.skipped)} left alone ({reason})"
    return text
