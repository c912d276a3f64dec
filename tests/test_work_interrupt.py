"""``pgfence work`` and Ctrl-C: the first stops claiming and lets the
running job finish; the second stops the worker at once, in every mode (a
job on the claiming thread, on a worker thread, on the event loop, in a
mixed module), not once the running job has ended.

Before the mend, the second Ctrl-C raised KeyboardInterrupt on the main
thread: the one-job loop stopped at once, but a worker with threads or a
loop waited for its running job (here 30 s) before it exited.
"""

from __future__ import annotations

import signal
import threading

import psycopg
import pytest

from pgtools import env_for, spawn, wait_for

pytestmark = pytest.mark.server_only

#: mode -> (handler modules, extra flags, the job's kind)
MODES = {
    "one-job loop": ("pgfence.handlers.builtin", (), "sleep"),
    "threads": ("pgfence.handlers.builtin", ("--threads", "2"), "sleep"),
    "async": ("pgfence.handlers.aio", ("--async-concurrency", "4"), "async_sleep"),
    "mixed": ("pgfence.handlers.builtin,pgfence.handlers.aio", (), "sleep"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_second_ctrl_c_stops_the_worker_at_once_in_every_mode(dsn: str, mode: str) -> None:
    handlers, flags, kind = MODES[mode]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgfence.enqueue(%s, '{\"seconds\": 30}'::jsonb)", (kind,))
        proc = spawn("work", "--handlers", handlers, *flags, "--lease", "60s",
                     env=env_for(dsn, PGFENCE_HANDLERS=handlers))
        lines: list[str] = []
        assert proc.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        try:
            wait_for(lambda: conn.execute("SELECT status FROM pgfence.jobs").fetchone() == ("running",),
                     message="the job to run")
            proc.send_signal(signal.SIGINT)
            # The first is taken (two signals sent before the worker's
            # handler runs would be one): it drains, the job runs on.
            wait_for(lambda: any("stopping: it finishes its running jobs" in line for line in lines),
                     message="the first Ctrl-C to be taken")
            assert proc.poll() is None
            assert conn.execute("SELECT status FROM pgfence.jobs").fetchone() == ("running",)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=10)     # the job has some 29 s left
            reader.join(timeout=10)
            err = "".join(lines)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 130, err
        assert err.rstrip().endswith("pgfence: interrupted"), err
        assert "Traceback" not in err
        # Left to its lease, as after a kill: still running, its attempt 1.
        assert conn.execute("SELECT status, attempt FROM pgfence.jobs").fetchall() == [("running", 1)]
