"""A handler's error can never kill its worker; children that keep crashing
are respawned with a growing delay, not in a tight loop."""

from __future__ import annotations

import re
import signal
import threading

from pgtools import env_for, job_row, pgfence, scalar, spawn, wait_for
from pgfence import enqueue

STORED = "ValueError: bad \\x00 byte and caf\\udce9"


def test_an_error_with_nul_and_a_lone_surrogate_is_stored_escaped_and_the_worker_goes_on(dsn, conn):
    poison = enqueue(conn, "poison_error", max_attempts=2)
    after = enqueue(conn, "noop")
    # Three outcomes: the poison job's two failed attempts and the noop job
    # (--burst could leave before the retry's backoff is over).
    result = pgfence("work", "--max-jobs", "3", "--handlers", "pgfence.handlers.builtin,poison_handlers",
                     "--poll-interval", "0.1", dsn=dsn,
                     env=env_for(dsn, PGFENCE_BACKOFF_BASE="0.01", PGFENCE_BACKOFF_MAX="0.01"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    row = job_row(conn, poison)
    assert (row["status"], row["attempt"], row["reclaims"], row["last_error"]) == ("failed", 2, 0, STORED)
    assert row["last_traceback"].endswith(STORED)
    assert "\x00" not in row["last_traceback"]
    assert job_row(conn, after)["status"] == "done"
    # Logged once per attempt, escaped on one line.
    assert len(re.findall(r"attempt 1 failed, retrying .*: " + re.escape(STORED.replace("\\", "\\\\")),
                          result.stderr)) == 1, result.stderr


class Lines:
    """Collects a process's stderr lines as they come."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def matching(self, pattern: str) -> list[re.Match]:
        return [m for line in list(self.lines) if (m := re.search(pattern, line))]


def test_a_child_that_keeps_crashing_is_respawned_with_a_growing_delay(dsn, conn):
    for _ in range(3):
        enqueue(conn, "exit_hard", max_reclaims=50, max_attempts=50)
    run = spawn("run", "--workers", "1", "--handlers", "pgfence.handlers.builtin,poison_handlers", dsn=dsn)
    log = Lines(run.stderr)
    try:
        pattern = r"worker \d+ crashed (\d+) times in a row, each within \d+s of its start: next start in ([0-9.]+)s"
        wait_for(lambda: len(log.matching(pattern)) >= 4, timeout=30, message="four delayed respawns")
        delays = [(int(m.group(1)), float(m.group(2))) for m in log.matching(pattern)][:4]
        assert delays == [(2, 0.2), (3, 0.4), (4, 0.8), (5, 1.6)], log.lines
        # Every crash was seen, and no start came before its delay allowed.
        starts = len(log.matching(r"worker \d+ started \(pid \d+\)"))
        crashes = len(log.matching(r"worker \d+ \(pid \d+\) exited with status 7"))
        assert starts <= crashes + 1
        assert crashes <= 8, log.lines
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)
    assert run.returncode == 0
    # The jobs were released at each crash (reclaims counted), never lost.
    assert scalar(conn, "SELECT count(*) FROM pgfence.all_jobs WHERE status = 'queued' AND reclaims >= 1") >= 1


def test_storable_text_and_the_crash_backoff_without_a_database():
    from pgfence.prefork.arbiter import CRASH_BACKOFF_MAX, crash_backoff
    from pgfence.errortext import storable

    assert storable("bad \x00 byte and caf\udce9 \u20ac") == "bad \\x00 byte and caf\\udce9 \u20ac"
    assert storable("plain text\nwith lines") == "plain text\nwith lines"
    assert [crash_backoff(n) for n in range(7)] == [0.0, 0.0, 0.2, 0.4, 0.8, 1.6, 3.2]
    assert crash_backoff(40) == CRASH_BACKOFF_MAX == 30.0
