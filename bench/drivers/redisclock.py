"""The clock of the Redis-brokered peers (Celery, Dramatiq) in the io section:
each task, when it ends, pushes its start and end time (``time.time()``, one
machine, one clock) and counts itself, in one round trip.  The harness polls
the count and takes jobs/s as N / (last end - first start)."""

from __future__ import annotations

import os
import threading
import time

import redis

DONE, STARTS, ENDS = "pgfence_bench:done", "pgfence_bench:starts", "pgfence_bench:ends"

_local = threading.local()


def client(url: str) -> redis.Redis:
    """A client of this thread's own, made in this process (a client shared
    across the threads of a forked worker lost a few tasks' records to
    'Bad file descriptor' in Dramatiq's processes)."""
    key = (os.getpid(), url)
    clients = _local.__dict__.setdefault("clients", {})
    if key not in clients:
        clients[key] = redis.Redis.from_url(url, single_connection_client=True)
    return clients[key]


def record(url: str, started: float) -> None:
    pipe = client(url).pipeline(transaction=False)
    pipe.rpush(STARTS, started)
    pipe.rpush(ENDS, time.time())
    pipe.incr(DONE)
    pipe.execute()


def reset(url: str) -> None:
    """An empty database for the next run (the broker's queue too)."""
    client(url).flushdb()


def done(url: str) -> int:
    return int(client(url).get(DONE) or 0)


def window(url: str) -> tuple[int, float]:
    """(tasks recorded, seconds from the first start to the last end)."""
    c = client(url)
    starts = [float(x) for x in c.lrange(STARTS, 0, -1)]
    ends = [float(x) for x in c.lrange(ENDS, 0, -1)]
    if not starts:
        return 0, 0.0
    return len(ends), max(ends) - min(starts)
