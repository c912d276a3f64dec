"""Who a process is, as ``locked_by`` and ``pgfence.supervisors`` name it.

Host name and pid do not tell supervisors apart: containers with the same
host name (host networking, a fixed ``hostname:``) start their arbiter as
pid 1, so children's pids and numbers repeat, and a dead child's release by
name once handed back another supervisor's live job.  Every supervisor (and
every ``pgfence work``) therefore draws a random instance id at start.
"""

from __future__ import annotations

import os
import secrets
import socket


def new_instance_id() -> str:
    """A random id for one supervisor (or one ``pgfence work``) process."""
    return secrets.token_hex(4)


def worker_name(pid: int, number: int, instance: str) -> str:
    """A child's name in ``locked_by``: ``host:pid:wN:instance``, unique to
    this child of this supervisor."""
    return f"{socket.gethostname()}:{pid}:w{number}:{instance}"


def supervisor_name(pid: int, instance: str) -> str:
    """``host:pid:instance``: a supervisor by its arbiter's pid and instance
    id (the row of ``pgfence.supervisors`` with that instance), as
    ``pgfence.kinds.updated_by`` names the one that recorded a kind."""
    return f"{socket.gethostname()}:{pid}:{instance}"


def process_name() -> str:
    """``host:pid:instance``: the name of a worker that runs on its own
    (``pgfence work``)."""
    return supervisor_name(os.getpid(), new_instance_id())
