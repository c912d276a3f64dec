"""The load test's report: text or JSON, the progress line, the chart.

Times come from the jobs table, by the database clock: wait is ``started_at
- run_at`` and run time ``finished_at - started_at`` of the attempt that
ended the job; throughput is the jobs over the time from the first enqueue
(``created_at``) to the last end (``finished_at``).
"""

from __future__ import annotations

import bisect
import datetime
import math
import sys
from collections import Counter
from typing import Any, TextIO

from pgfence.tools.loadtest.mix import EXPECTED, KINDS


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between the closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latencies(values: list[float]) -> dict[str, float | None]:
    return {f"p{p}": (None if (v := percentile(values, p)) is None else round(v, 4)) for p in (50, 95, 99)}


def summary(jobs: list[dict[str, Any]], enqueued: dict[int, str]) -> dict[str, Any]:
    """Throughput, latencies and final states per mix from the job rows."""
    waits = [(j["started_at"] - j["run_at"]).total_seconds() for j in jobs if j["started_at"] and j["run_at"]]
    runs = [(j["finished_at"] - j["started_at"]).total_seconds() for j in jobs
            if j["finished_at"] and j["started_at"] and j["finished_at"] >= j["started_at"]]
    ended = [j["finished_at"] for j in jobs if j["finished_at"]]
    first = min((j["created_at"] for j in jobs), default=None)
    span = (max(ended) - first).total_seconds() if ended and first else 0.0
    by_mix: dict[str, dict[str, Any]] = {}
    for name in KINDS:
        states = Counter(j["status"] for j in jobs if enqueued.get(j["id"]) == name)
        count = sum(1 for m in enqueued.values() if m == name)
        if count:
            by_mix[name] = {"count": count, "expected": EXPECTED[name], "states": dict(sorted(states.items()))}
    return {
        "ended": len(ended),
        "seconds": round(span, 3),
        "jobs_per_second": round(len(ended) / span, 2) if span > 0 else None,
        "wait_seconds": latencies(waits),
        "run_seconds": latencies(runs),
        "by_mix": by_mix,
    }


def ended_since(jobs: list[dict[str, Any]], zero: datetime.datetime | None) -> list[float]:
    """Seconds from ``zero`` (the database clock when the faults' clock
    started, the time line of the fault events) at which each job ended;
    from the first enqueue when ``zero`` is unknown.  The chart draws the
    jobs and the faults on this one time line: counted from the first
    enqueue, the jobs came out shifted by the enqueue's length against
    the faults."""
    if zero is None:
        zero = min((j["created_at"] for j in jobs), default=None)
    if zero is None:
        return []
    return [(j["finished_at"] - zero).total_seconds() for j in jobs if j["finished_at"]]


def around_holds(jobs: list[dict[str, Any]], events: list[dict[str, Any]],
                 zero: datetime.datetime | None) -> list[dict[str, Any]]:
    """For each xmin fault: jobs ended per second in the hold's length
    before it, during it, and after it (by the database clock, from
    ``zero``, the time line of the fault events): the dip and the
    recovery."""
    if zero is None:
        return []
    ended = sorted(ended_since(jobs, zero))

    def rate(low: float, high: float) -> float:
        return round((bisect.bisect_left(ended, high) - bisect.bisect_left(ended, low)) / (high - low), 1)

    out = []
    for event in events:
        if event["fault"] != "xmin":
            continue
        start, span = float(event["t"]), float(event["seconds"])
        out.append({"t": start, "seconds": span, "before": rate(start - span, start),
                    "during": rate(start, start + span), "after": rate(start + span, start + 2 * span)})
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def text(report: dict[str, Any]) -> str:
    c, s, m = report["config"], report["summary"], report.get("metrics")
    head = (f"pgfence loadtest: {c['jobs']} jobs, {c['supervisors']} supervisor(s) x {c['workers']} worker(s)"
            + (f" of {c['capacity']} jobs each ({c['threads']} thread(s)"
               + (f", {c['async_concurrency']} async" if c["capacity"] > c["threads"] else "") + ")"
               if c.get("capacity", 1) > 1 else "")
            + f", lease {c['lease']:g}s, seed {c['seed']}, queue {report['queue']}")
    head += (", through PgBouncer" if c["pgbouncer"] else "") + (", embedded server" if c["embedded"] else "")
    head += ", UNPROTECTED" if c["unprotected"] else ""
    lines = [
        head,
        (f"  elapsed {report['elapsed_seconds']:.1f}s; {s['ended']} jobs ended in {s['seconds']:.1f}s: "
         f"{s['jobs_per_second'] or 0:.1f} jobs/s"),
        ("  wait " + " ".join(f"{k} {_ms(v)}" for k, v in s["wait_seconds"].items())
         + "; run " + " ".join(f"{k} {_ms(v)}" for k, v in s["run_seconds"].items())),
        "  final states: " + "; ".join(
            f"{name} {v['count']} (" + ", ".join(f"{st} {n}" for st, n in v["states"].items()) + ")"
            for name, v in s["by_mix"].items()),
    ]
    if m is not None:
        lost = ", ".join(f"{r} {n:g}" for r, n in m["lease_lost_total"].items() if n) or "none"
        lines.append(f"  reclaims {m['reclaims_total']:g} (database: {report['database']['reclaims']}); "
                     f"leases lost: {lost}; double runs prevented {m['double_run_prevented_total']:g}; "
                     f"worker restarts {m['worker_restarts_total']:g}")
    faults = report["faults"]
    if faults["injected"] or faults["skipped"]:
        parts = [f"{f} {n}" for f, n in faults["injected"].items() if f not in faults["skipped"]]
        parts += [f"{f} skipped: {why}" for f, why in faults["skipped"].items()]
        lines.append("  faults: " + ", ".join(parts))
    for hold in faults.get("xmin_holds", []):
        lines.append(f"  xmin horizon held at {hold['t']:.1f}s for {hold['seconds']:.1f}s: jobs/s "
                     f"{hold['before']:g} before, {hold['during']:g} during, {hold['after']:g} after")
    for lim in report.get("limits") or []:
        line = f"  limits: {lim['mix']} ({lim['kind']}): {lim['max_concurrent']} at once"
        line += "" if lim["concurrency"] is None else f" (limit {lim['concurrency']})"
        if lim["per_key_concurrency"] is not None:
            line += (f", {lim.get('max_per_key', 0)} of one key (limit {lim['per_key_concurrency']}, "
                     f"{lim['keys']} keys)")
        lines.append(line + f", {lim['attempts']} attempts")
    audit = report["audit"]
    lines.append("audit: " + ("PASS" if audit["passed"] else "FAIL"))
    for check in audit["checks"]:
        lines.append(f"  [{'ok' if check['passed'] else 'FAIL'}] {check['name']}: {check['detail']}")
        if not check["passed"]:
            for dup in check.get("duplicates", [])[:10]:
                lines.append(f"      job {dup['job']}: rows {dup['rows']} by attempts {dup['attempts']}")
            for over in check.get("over", [])[:10]:
                lines.append(f"      {over['mix']}" + (f" key {over['key']}" if over["key"] is not None else "")
                             + f": {over['max']} at once at {over['at']:.3f}s (limit {over['limit']}): "
                             + ", ".join(f"job {h['job']} attempt {h['attempt']} {h['start']:.3f}s..{h['end']:.3f}s "
                                         f"({h['ended']})" for h in over["holders"][:10]))
            for lost in check.get("unplaced", [])[:10]:
                lines.append(f"      job {lost['job']} attempt {lost['attempt']}: not placed, {lost['why']}")
            for wrong in check.get("wrong", [])[:10]:
                lines.append(f"      job {wrong['job']} ({wrong['mix']}): {wrong['status']}, attempt "
                             f"{wrong['attempt']}: {wrong['last_error']}")
    return "\n".join(lines)


class Progress:
    """One updating line on stderr (\\r), when stderr is a terminal or asked."""

    def __init__(self, total: int, enabled: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = bool(enabled) or self.stream.isatty()
        self.total = total
        self.shown = False

    def update(self, ended: int, running: int, elapsed: float, faults: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * ended / self.total) if self.total else width
        rate = ended / elapsed if elapsed > 0 else 0.0
        line = (f"\r[{'#' * filled}{'.' * (width - filled)}] {ended}/{self.total} ended, {running} running, "
                f"{rate:.1f} jobs/s, {faults} faults, {elapsed:.0f}s ")
        self.stream.write(line)
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def plot(path: str, report: dict[str, Any], finished: list[float], samples: list[tuple[float, float]]) -> None:
    """A PNG of jobs ended per second and cumulative reclaims over time, with
    the faults marked.  ``finished``: seconds from the start at which each
    job ended; ``samples``: (seconds, pgfence_reclaims_total summed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max(finished + [t for t, _ in samples] + [1.0])
    bins = max(1, math.ceil(end))
    per_second = [0] * bins
    for t in finished:
        per_second[min(bins - 1, max(0, int(t)))] += 1
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.bar(range(bins), per_second, width=1.0, align="edge", color="tab:blue")
    top.set_ylabel("jobs ended / s")
    top.set_title(f"pgfence loadtest: {report['config']['jobs']} jobs, {report['config']['supervisors']} x "
                  f"{report['config']['workers']} workers, seed {report['config']['seed']}")
    if samples:
        bottom.step([t for t, _ in samples], [v for _, v in samples], where="post", color="tab:red")
    bottom.set_ylabel("reclaims (cumulative)")
    bottom.set_xlabel("seconds since the jobs were enqueued (the faults' clock)")
    colors = {"stop": "tab:orange", "kill": "black", "kill-heartbeat": "tab:purple", "terminate": "tab:brown",
              "partition": "tab:cyan", "restart": "tab:green", "xmin": "tab:olive"}
    seen = set()
    for event in report["faults"]["events"]:
        label = event["fault"] if event["fault"] not in seen else None
        seen.add(event["fault"])
        for axis in (top, bottom):
            axis.axvline(event["t"], color=colors.get(event["fault"], "gray"), linestyle="--", linewidth=0.8,
                         label=label if axis is top else None)
            if event["fault"] == "xmin":   # the span the horizon was held
                axis.axvspan(event["t"], event["t"] + event["seconds"], color=colors["xmin"], alpha=0.15)
    if seen:
        top.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
