"""The enqueue section (``bench/run.sh --only enqueue``): how fast each
system puts jobs in, from Python, one per transaction and in batches.

pgfence's ``enqueue`` beside the bare ``INSERT ... RETURNING id`` round trip
on the same kind of connection, ``enqueue_many`` of 10,000 jobs a call and
``aenqueue`` (one connection, then several at once); pgqueuer's
``Queries.enqueue`` of one job and of lists of 10,000; procrastinate's
``defer`` and ``batch_defer`` (sync, and their async forms); Celery's
``delay`` to Redis.  Each runs in a process of its own (``drivers.
pgfence_enqueue`` by the project's interpreter, ``drivers.enqueue_peers`` by
bench/.venv's) on a database made for the section, emptied and
checkpointed before every run.  The runs alternate: run 1 of every
configuration in order, run 2 in the reverse order, and so on, so that a
drift of the machine falls on all of them alike.  Each run waits for a
quiet machine, and a run during which more than a fifth of the machine's
CPU went elsewhere is taken again (at most as many times as the
configuration has runs).

jobs/s is N over the wall time of the calls (after a warm-up that opened
the connections and prepared the statements); CPU is the driver process's
and the server's (PostgreSQL backends, or redis-server) over the same span,
per job.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import dataclass

from harness import BENCH, DISTURBED, execute, log, quiesce

#: Goals of the section, reported, never asserted.
GOALS = {"many_jobs_per_s": 100_000, "many_vs_pgqueuer": 2.0, "enqueue_vs_insert": 0.90}
BATCH = 10_000
CONCURRENT = 8


@dataclass
class Config:
    key: str
    system: str
    call: str
    per_call: int          # jobs per call (and per transaction)
    n: int
    argv: list[str]        # the driver's command line
    env: dict | None       # None: bench/.venv's environment
    db: str                # "pgfence", "pgqueuer", "procrastinate", "celery"


class EnqueueSection:
    def __init__(self, bench) -> None:
        self.bench = bench
        self.args = bench.args

    def configs(self) -> list[Config]:
        a, b = self.args, self.bench
        one, many = a.enqueue_n, a.enqueue_many_n
        proj = [str(b.pgfence.python), "-m", "drivers.pgfence_enqueue"]
        peer = [str(BENCH / ".venv" / "bin" / "python"), "-m", "drivers.enqueue_peers"]
        pf, pq, pc = self.dsn["pgfence"], self.dsn["pgqueuer"], self.dsn["procrastinate"]
        env = b.pgfence.env
        conc = min(CONCURRENT, max(1, one // 100))
        # procrastinate defers a batch at about 2,500 jobs/s here: two calls, not ten.
        slow = min(many, 2 * BATCH)
        return [
            Config("pgfence_enqueue", "pgfence", "enqueue(conn, kind, payload)", 1, one,
                   [*proj, "enqueue", pf, str(one)], env, "pgfence"),
            Config("bare_insert", "bare INSERT (psycopg)", "INSERT INTO pgfence.jobs (kind, payload) VALUES "
                   "(%s, %s) RETURNING id", 1, one, [*proj, "insert", pf, str(one)], env, "pgfence"),
            Config("pgfence_aenqueue", "pgfence", "await aenqueue(aconn, kind, payload), 1 connection", 1, one,
                   [*proj, "aenqueue", pf, str(one), "1"], env, "pgfence"),
            Config(f"pgfence_aenqueue_c{conc}", "pgfence", f"await aenqueue(aconn, ...), {conc} connections at once",
                   1, one, [*proj, "aenqueue", pf, str(one), str(conc)], env, "pgfence"),
            Config("pgfence_many", "pgfence", "enqueue_many(conn, jobs)", BATCH, many,
                   [*proj, "many", pf, str(many), str(BATCH)], env, "pgfence"),
            Config("pgqueuer_one", "pgqueuer 1.6 (asyncpg)", "await Queries.enqueue(entrypoint, payload)", 1, one,
                   [*peer, "pgqueuer-one", pq, str(one)], None, "pgqueuer"),
            Config("pgqueuer_batch", "pgqueuer 1.6 (asyncpg)", "await Queries.enqueue(entrypoints, payloads, "
                   "priorities)", BATCH, many, [*peer, "pgqueuer-batch", pq, str(many), str(BATCH)], None, "pgqueuer"),
            Config("procrastinate_defer", "procrastinate 3.10 (psycopg)", "Task.defer(**kwargs)", 1, one,
                   [*peer, "procrastinate-defer", pc, str(one)], None, "procrastinate"),
            Config("procrastinate_batch", "procrastinate 3.10 (psycopg)", "Task.batch_defer(*kwargs)", BATCH, slow,
                   [*peer, "procrastinate-batch", pc, str(slow), str(BATCH)], None, "procrastinate"),
            Config("procrastinate_defer_async", "procrastinate 3.10 (psycopg)", "await Task.defer_async(**kwargs)",
                   1, one, [*peer, "procrastinate-defer-async", pc, str(one)], None, "procrastinate"),
            Config("procrastinate_batch_async", "procrastinate 3.10 (psycopg)",
                   "await Task.batch_defer_async(*kwargs)", BATCH, slow,
                   [*peer, "procrastinate-batch-async", pc, str(slow), str(BATCH)], None, "procrastinate"),
            Config("celery_delay", "Celery 5.7 (Redis broker)", "task.delay(i)", 1, one,
                   [*peer, "celery-delay", self.redis, str(one)], None, "celery"),
        ]

    # -- the databases ---------------------------------------------------------------------

    def setup(self) -> None:
        b = self.bench
        self.dsn = {name: b.server.create(f"enqueue_{name}") for name in ("pgfence", "pgqueuer", "procrastinate")}
        b.pgfence.migrate(self.dsn["pgfence"])
        for name in ("pgqueuer", "procrastinate"):
            subprocess.run([str(BENCH / ".venv" / "bin" / "python"), "-m", "drivers.enqueue_peers",
                            f"{name}-setup", self.dsn[name]], cwd=BENCH, check=True,
                           stdout=b.logfile("enqueue"), stderr=subprocess.STDOUT)
        self.redis = os.environ.get("PGFENCE_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/11")

    def reset(self, c: Config) -> None:
        """An empty table (the driver flushes the broker's database itself),
        vacuumed, and a checkpoint, so that every run starts alike."""
        tables = {"pgfence": ["TRUNCATE pgfence.jobs RESTART IDENTITY", "VACUUM pgfence.jobs"],
                  "pgqueuer": ["TRUNCATE pgqueuer, pgqueuer_log", "VACUUM pgqueuer"],
                  "procrastinate": ["TRUNCATE procrastinate_jobs CASCADE", "VACUUM procrastinate_jobs"]}
        if c.db in tables:
            execute(self.dsn[c.db], *tables[c.db], "CHECKPOINT")
        else:
            execute(self.dsn["pgfence"], "CHECKPOINT")

    # -- the runs ---------------------------------------------------------------------------

    def once(self, c: Config) -> dict:
        self.reset(c)
        quiet = quiesce()
        env = c.env if c.env is not None else {**os.environ}
        done = subprocess.run(c.argv, cwd=BENCH, env=env, capture_output=True, text=True, check=False,
                              timeout=600)
        with self.bench.logfile("enqueue") as f:
            f.write(f"$ {' '.join(c.argv)}\n{done.stdout}{done.stderr}".encode())
        if done.returncode != 0:
            raise RuntimeError(f"{c.key}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["jobs_per_s"] = r["jobs"] / r["wall_s"]
        r["client_us"] = 1e6 * r["client_s"] / r["jobs"]
        r["server_us"] = 1e6 * r["server_s"] / r["jobs"]
        r["other_share"] = max(0.0, r["busy_s"] - r["client_s"] - r["server_s"]) / max(1e-9, r["total_s"])
        r["busy_before"] = round(quiet, 3)
        return r

    def run(self) -> dict:
        a = self.args
        self.setup()
        configs = self.configs()
        rows: dict[str, dict] = {c.key: {"system": c.system, "call": c.call, "per_call": c.per_call, "n": c.n,
                                         "runs": [], "discarded": [], "error": None} for c in configs}
        # As many runs again as it has runs, for each configuration; none
        # when the runs do not wait for a quiet machine.
        retries = {c.key: a.runs if a.quiet_timeout > 0 else 0 for c in configs}
        log(f"enqueue: {len(configs)} configurations, {a.runs} runs each, alternating (ABAB: odd runs in order, "
            "even runs in the reverse order)")
        for r in range(a.runs):
            for c in (configs if r % 2 == 0 else configs[::-1]):
                row = rows[c.key]
                if row["error"]:
                    continue
                while True:
                    try:
                        got = self.once(c)
                    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                        row["error"] = str(exc)
                        log(f"  {c.key}: FAILED: {exc}")
                        break
                    log(f"  {c.system}, {c.call}, run {r + 1}/{a.runs}: {got['jobs']:,} jobs, "
                        f"{got['jobs_per_s']:,.0f} jobs/s; CPU us/job {got['client_us']:.1f} client, "
                        f"{got['server_us']:.1f} server; {got['other_share']:.0%} of the machine elsewhere")
                    if got["other_share"] > DISTURBED and retries[c.key] > 0:
                        retries[c.key] -= 1
                        row["discarded"].append(got)
                        log("  disturbed: run again")
                        continue
                    row["runs"].append(got)
                    break
        for row in rows.values():
            runs = row["runs"]
            if runs:
                row["jobs_per_s"] = statistics.median(x["jobs_per_s"] for x in runs)
                row["client_us"] = statistics.median(x["client_us"] for x in runs)
                row["server_us"] = statistics.median(x["server_us"] for x in runs)
                row["disturbed"] = any(x["other_share"] > DISTURBED for x in runs)
        for key, row in rows.items():
            if row["error"]:
                self.bench.errors[f"enqueue_{key}"] = row["error"]
        return {"runs": a.runs, "batch": BATCH, "order": "ABAB (odd runs in order, even runs reversed)",
                "rows": rows}


# -- the report ------------------------------------------------------------------------------


def _have(e: dict, key: str) -> dict | None:
    row = e["rows"].get(key)
    return row if row and row.get("runs") else None


def _paired(a: dict, b: dict, fmt: str) -> str:
    """The ratios of the two configurations' runs taken side by side (run k
    of each, next to each other in the alternation), which a drift of the
    machine between rounds leaves out."""
    ratios = sorted(x["jobs_per_s"] / y["jobs_per_s"] for x, y in zip(a["runs"], b["runs"], strict=False))
    return (f"run by run {format(ratios[0], fmt)} to {format(ratios[-1], fmt)}, median "
            f"{format(statistics.median(ratios), fmt)}")


def goals(e: dict) -> list[dict]:
    out: list[dict] = []

    def goal(name: str, target: str, measured: float, met: bool, detail: str, unit: str) -> None:
        out.append({"goal": name, "target": target, "measured": measured, "unit": unit, "met": met,
                    "detail": detail})

    many, pgq = _have(e, "pgfence_many"), _have(e, "pgqueuer_batch")
    one, bare = _have(e, "pgfence_enqueue"), _have(e, "bare_insert")
    if many:
        goal(f"enqueue_many, {e['batch']:,} jobs a call", f">= {GOALS['many_jobs_per_s']:,} jobs/s",
             many["jobs_per_s"], many["jobs_per_s"] >= GOALS["many_jobs_per_s"],
             f"CPU {many['client_us']:.1f} us client + {many['server_us']:.1f} us server a job", "jobs/s")
    if many and pgq:
        r = many["jobs_per_s"] / pgq["jobs_per_s"]
        goal("enqueue_many vs pgqueuer's batch enqueue", f">= {GOALS['many_vs_pgqueuer']:g}x", r,
             r >= GOALS["many_vs_pgqueuer"],
             f"{many['jobs_per_s']:,.0f} / {pgq['jobs_per_s']:,.0f}; {_paired(many, pgq, '.2f')}", "x")
    if one and bare:
        r = one["jobs_per_s"] / bare["jobs_per_s"]
        cpu = (one["client_us"] + one["server_us"]) / (bare["client_us"] + bare["server_us"])
        goal("enqueue, one job a transaction, vs the bare INSERT round trip", f">= {GOALS['enqueue_vs_insert']:.0%}",
             r, r >= GOALS["enqueue_vs_insert"],
             f"{one['jobs_per_s']:,.0f} / {bare['jobs_per_s']:,.0f} jobs/s, {_paired(one, bare, '.0%')}; CPU a job "
             f"{cpu:.2f}x ({one['client_us']:.0f} + {one['server_us']:.0f} us vs {bare['client_us']:.0f} + "
             f"{bare['server_us']:.0f})", "%")
    return out


def markdown(e: dict) -> list[str]:
    rows = e["rows"]
    if not any(r.get("runs") for r in rows.values()):
        return []
    bare, pgq = _have(e, "bare_insert"), _have(e, "pgqueuer_batch")
    lines = [f"#### enqueue: jobs put in from Python (median of {e['runs']} runs, taken {e['order']})", "",
             "| system | call | jobs a call | N | jobs/s | vs | CPU us a job: client / server |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key, r in rows.items():
        if not r.get("runs"):
            lines.append(f"| {r['system']} | `{r['call']}` | {r['per_call']:,} | {r['n']:,} | failed | | |")
            continue
        ref = bare if r["per_call"] == 1 else pgq
        vs = f"{r['jobs_per_s'] / ref['jobs_per_s']:.2f}x" if ref else "-"
        flag = " (disturbed)" if r.get("disturbed") else ""
        lines.append(f"| {r['system']} | `{r['call']}` | {r['per_call']:,} | {r['n']:,} | "
                     f"{r['jobs_per_s']:,.0f}{flag} | {vs} | {r['client_us']:.1f} / {r['server_us']:.1f} |")
    lines += ["", ("jobs/s: N over the wall time of the calls, after a warm-up (connections open, statements "
                   "prepared); one job a call is one transaction (an autocommit connection), a batch one "
                   "transaction a call. vs: over the bare INSERT round trip for one-job calls, over pgqueuer's "
                   "batch enqueue for batches. CPU: the driver process's user + system time and the server's "
                   "(its PostgreSQL backends; redis-server for Celery) over the calls, per job. (disturbed): more "
                   "than a fifth of the machine's CPU went elsewhere during a run."), ""]
    return lines
