"""The effect of the arbiter's gc.freeze() on its worker children's memory.

    .venv/bin/python bench/gc_freeze.py [ADMIN_DSN] [JOBS]

Runs `pgfence run --workers 4 --threads 8` over JOBS short sleep jobs
(default 4,000) four times, alternately as it is and with gc.freeze replaced
by a no-op before pgfence is imported, and prints each worker child's USS
(private pages) and RSS once the jobs are done.  Use the project's own
interpreter: it imports pgfence.  It makes and drops a scratch database,
pgfence_bench_gcfreeze.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ADMIN = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/postgres"
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
DB = "pgfence_bench_gcfreeze"
DSN = make_conninfo(ADMIN, dbname=DB)


def memory(pid: int) -> tuple[float, float]:
    """(USS, RSS) in MiB."""
    f: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        f[key.strip()] = int(value.split()[0])
    return (f["Private_Clean"] + f["Private_Dirty"]) / 1024, f["Rss"] / 1024


def children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def once(freeze: bool) -> list[tuple[float, float]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("DELETE FROM pgfence.jobs")
        conn.execute("INSERT INTO pgfence.jobs (kind, payload) "
                     "SELECT 'sleep', '{\"seconds\": 0.01}' FROM generate_series(1, %s)", (JOBS,))
    patch = "" if freeze else "import gc; gc.freeze = lambda: None; "
    code = patch + "import sys; from pgfence.cli.main import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "--dsn", DSN, "--workers", "4", "--threads", "8",
                             "--handlers", "pgfence.handlers.builtin", "--log-level", "WARNING"])
    try:
        with psycopg.connect(DSN, autocommit=True) as conn:
            deadline = time.monotonic() + 300
            while conn.execute("SELECT count(*) FROM pgfence.jobs WHERE status <> 'done'").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("gc_freeze: the jobs were not done within 300 s")
                time.sleep(0.2)
        time.sleep(2)       # let the children settle into idle
        workers = [k for k in children(proc.pid) if b"worker" in Path(f"/proc/{k}/cmdline").read_bytes()]
        return [memory(k) for k in workers]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB}")
    try:
        subprocess.run([sys.executable, "-m", "pgfence", "migrate", "--dsn", DSN], check=True, capture_output=True)
        uss: dict[bool, list[float]] = {True: [], False: []}
        for freeze in (True, False, True, False):
            mem = once(freeze)
            uss[freeze] += [u for u, _ in mem]
            print(f"{'gc.freeze()   ' if freeze else 'no gc.freeze()'}  worker USS MiB "
                  f"{[round(u, 1) for u, _ in mem]}  RSS MiB {[round(r, 1) for _, r in mem]}", flush=True)
        a, b = statistics.median(uss[True]), statistics.median(uss[False])
        print(f"median worker USS: {a:.1f} MiB with gc.freeze(), {b:.1f} MiB without ({b - a:+.1f} MiB, "
              f"{(b - a) / b:.0%} of it saved per child)")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
