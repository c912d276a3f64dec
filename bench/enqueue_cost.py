"""The enqueue's cost before and after migration 0006 (pgfence.kinds and
the trigger that applies a kind's options to an insert that leaves them out).

    python bench/enqueue_cost.py [ADMIN_DSN] [ROWS] [RUNS]

Makes three scratch databases (migrated up to 0005; up to 0006 without a
kinds row; up to 0006 with one), inserts ROWS jobs in one statement four ways
and prints, per way, the median server CPU time of RUNS runs.  CPU time is
read from /proc for the statement's backend, so the server must run on this
machine; on a shared machine it varies far less than wall time does.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path


from scratch import admin_dsn, argv, scratch_database

TICK = os.sysconf("SC_CLK_TCK")

WAYS = {
    "INSERT (kind, payload)":
        "INSERT INTO pgfence.jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, %(n)s)",
    "INSERT with all options":
        "INSERT INTO pgfence.jobs (kind, payload, queue, max_attempts, max_reclaims) "
        "SELECT 'noop', '{}', 'default', 5, 3 FROM generate_series(1, %(n)s)",
    "enqueue(kind, payload)":
        "SELECT count(pgfence.enqueue('noop', '{}')) FROM generate_series(1, %(n)s)",
    "enqueue with all options":
        "SELECT count(pgfence.enqueue('noop', '{}', 'default', 0, NULL, 5, NULL, 3)) "
        "FROM generate_series(1, %(n)s)",
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def measure(admin: str, upto: int, kinds_row: bool, rows: int, runs: int) -> dict[str, float]:
    with scratch_database(admin, upto) as conn:
        if kinds_row:
            conn.execute("INSERT INTO pgfence.kinds (kind, queue, max_attempts) VALUES ('noop', 'default', 5)")
        pid = conn.info.backend_pid
        out = {}
        for way, sql in WAYS.items():
            times = []
            for _ in range(runs):
                conn.execute("TRUNCATE pgfence.jobs")
                before = cpu_seconds(pid)
                conn.execute(sql, {"n": rows})
                times.append(cpu_seconds(pid) - before)
            out[way] = statistics.median(times)
        return out


def main() -> None:
    admin = admin_dsn()
    rows = argv(2, 100_000)
    runs = argv(3, 5)
    columns = {"0005": measure(admin, 5, False, rows, runs),
               "0006, no kinds row": measure(admin, 6, False, rows, runs),
               "0006, kinds row": measure(admin, 6, True, rows, runs)}
    print(f"server CPU per row (us), {rows} rows, median of {runs} runs")
    print(f"{'':26}" + "".join(f"{c:>20}" for c in columns))
    for way in WAYS:
        print(f"{way:26}" + "".join(f"{columns[c][way] / rows * 1e6:>20.1f}" for c in columns))


if __name__ == "__main__":
    main()
