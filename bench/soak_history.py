"""The soak section's history lines (bench/soak.py runs them on its embedded
server): what a large history costs the claim of one job and the renewal of
1,000 leases, and how long retention takes to drop a day's history.

History is simulated: finished jobs inserted straight into
pgfence.job_history (through its parent, so into today's partition) where the
schema has that table, else into pgfence.jobs as finished rows, the only
history a schema without it keeps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import psycopg
from harness import BENCH, Pgfence, Server, execute, log, time_claims


def history_cost(server: Server, pgfence: Pgfence, a: argparse.Namespace, history_table: bool) -> dict:
    """The claim of one job and the renewal of 1,000 leases with
    ``a.soak_history_rows`` finished jobs in history and with none, each
    interleaved between two databases of ``server``; where the schema has
    pgfence.job_history, the drop of the partition holding them.  The
    results under "history_cost" and "retention"."""
    out: dict = {}
    rows = a.soak_history_rows
    empty, big = server.create("soak_hist_empty"), server.create("soak_hist_big")
    for dsn in (empty, big):
        pgfence.migrate(dsn)
    where = "pgfence.job_history" if history_table else "pgfence.jobs (finished rows)"
    log(f"soak: {rows:,} simulated finished jobs in {where}")
    started = time.monotonic()
    insert_history(big, rows, history_table)
    claims, warmup, leases = a.claims, 100, 1000
    for dsn in (empty, big):
        execute(dsn, f"INSERT INTO pgfence.jobs (kind) SELECT 'noop' FROM generate_series(1, "
                     f"{claims + warmup + leases})",
                "VACUUM ANALYZE", "CHECKPOINT")
    log(f"  filled and vacuumed in {time.monotonic() - started:,.0f} s; {claims:,} claims of one job on each, "
        "interleaved")
    queries = pgfence.queries()
    # Unprepared, as the claim section times it.
    conns = {"empty": psycopg.connect(empty, autocommit=True, prepare_threshold=None),
             "history": psycopg.connect(big, autocommit=True, prepare_threshold=None)}
    try:
        times = time_claims(conns, queries["claim"], queries["complete"], claims, warmup)
    finally:
        for conn in conns.values():
            conn.close()
    claim = {k: statistics.median(v) for k, v in times.items()}
    rounds = 20
    log(f"  renewal of {leases:,} leases, {rounds} rounds on each, interleaved")
    proc = subprocess.run([str(pgfence.python), str(BENCH / "pgfence_probe.py"), "renew", str(leases),
                           str(rounds), empty, big], capture_output=True, text=True, cwd=pgfence.root,
                          env=pgfence.env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"renewal probe: {proc.stderr.strip()[-300:]}")
    renewed = json.loads(proc.stdout)
    renew = renewed["median_ms"]
    h = out["history_cost"] = {
        "rows": rows, "where": where, "claims": claims, "claim_empty_ms": claim["empty"],
        "claim_history_ms": claim["history"], "claim_ratio": claim["history"] / claim["empty"],
        "leases": leases, "rounds": rounds, "renew_empty_ms": renew[0], "renew_history_ms": renew[1],
        "renew_ratio": renew[1] / renew[0],
        "claim_ms": times, "renew_ms": {"empty": renewed["round_ms"][0], "history": renewed["round_ms"][1]}}
    log(f"  claim {h['claim_history_ms']:.3f} vs {h['claim_empty_ms']:.3f} ms ({h['claim_ratio']:.2f}x); "
        f"renewal {h['renew_history_ms']:.1f} vs {h['renew_empty_ms']:.1f} ms ({h['renew_ratio']:.2f}x)")
    if history_table:
        r = out["retention"] = retention(big, queries)
        log(f"  dropping the partition of {r['rows']:,} rows: {r['seconds']:.3f} s")
    return out


#: A simulated finished job's value for each history column the benchmark
#: knows; any other column keeps its default.  ``i`` counts the rows, ``t``
#: spreads them over today so far (today's partition exists: jobs finish
#: into it).  Ids are negative, clear of every real job's.
_HISTORY_VALUES = {"id": "-i", "queue": "'default'", "kind": "'noop'", "payload": "'{}'::jsonb",
                   "status": "'done'", "attempt": "1", "max_attempts": "5", "reclaims": "0", "max_reclaims": "3",
                   "priority": "0", "run_at": "t", "created_at": "t", "started_at": "t", "finished_at": "t"}


def insert_history(dsn: str, rows: int, history_table: bool, chunk: int = 2_000_000) -> None:
    """``rows`` finished jobs: into pgfence.job_history (routed to its
    partitions) where the schema has it, else into pgfence.jobs as finished
    rows, in chunks (the claim section's history too)."""
    if history_table:
        cols = [c for (c,) in execute(dsn, "SELECT column_name FROM information_schema.columns WHERE "
                                           "table_schema = 'pgfence' AND table_name = 'job_history' "
                                           "ORDER BY ordinal_position") if c in _HISTORY_VALUES]
        target = f"pgfence.job_history ({', '.join(cols)})"
        values = ", ".join(_HISTORY_VALUES[c] for c in cols)
    else:
        target = "pgfence.jobs (kind, status, attempt, started_at, finished_at, created_at, run_at)"
        values = "'noop', 'done', 1, t, t, t, t"
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        execute(dsn, f"INSERT INTO {target} SELECT {values} FROM (SELECT i, date_trunc('day', now()) "
                     f"+ (now() - date_trunc('day', now())) * (i::float8 / {int(rows)}) AS t "
                     f"FROM generate_series({start + 1}, {start + n}) AS i) s")


def retention_steps(queries: dict[str, str], name: str) -> list[tuple[str, str, dict]]:
    """pgfence's own statements that detach, then drop, the history partition
    ``name`` (step, statement, parameters): one function for both steps
    (history_partition_remove) or one each (history_partition_detach, _drop),
    as the checkout under test has them."""
    if "history_partition_remove" in queries:
        return [(step, queries["history_partition_remove"], {"name": name, "drop": step == "drop"})
                for step in ("detach", "drop")]
    if "history_partition_detach" in queries and "history_partition_drop" in queries:
        return [(step, queries[f"history_partition_{step}"], {"name": name}) for step in ("detach", "drop")]
    raise RuntimeError("this pgfence has pgfence.job_history but no statement that removes a history partition")


def retention(dsn: str, queries: dict[str, str]) -> dict:
    """Detach, then drop, the history partition holding the most rows (the
    simulated day) with pgfence's own statements, each in a transaction of
    its own as its retention runs them; their times and the rows it held."""
    part, rows = execute(dsn, "VACUUM ANALYZE pgfence.job_history",
                         "SELECT c.relname::text, c.reltuples::bigint FROM "
                         "pg_partition_tree('pgfence.job_history') p JOIN pg_class c ON c.oid = p.relid "
                         "WHERE p.isleaf ORDER BY c.reltuples DESC LIMIT 1")[0]
    seconds = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for step, sql, params in retention_steps(queries, part):
            started = time.perf_counter()
            with conn.transaction():
                done = conn.execute(sql, params).fetchone()[0]
            seconds[step] = time.perf_counter() - started
            if not done:
                raise RuntimeError(f"pgfence's statement did not {step} {part}")
    return {"partition": part, "rows": rows, "detach_s": seconds["detach"], "drop_s": seconds["drop"],
            "seconds": seconds["detach"] + seconds["drop"]}
