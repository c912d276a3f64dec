"""The audit of the concurrency limits: no instant of the run saw more
attempts of a limited mix's kind (or of one of its concurrency keys) holding
a live lease than its limit allows.

Each attempt of the run's limited jobs is placed on the database clock from
the history pgfence keeps, faults included:

- it starts at its claim (``started_at``: of the job for its last attempt,
  of its pgfence.job_attempts row for an earlier one);
- the attempt that completed its job ends at the job's ``finished_at``;
- every other attempt has a row in pgfence.job_attempts, and ends at its
  ``ended_at``: for a lease lost to a reclaim (outcome ``lease_lost``: a
  SIGSTOPped or SIGKILLed worker, a partition, a server restart) the end of
  its lease as the reclaim found it, not when the frozen worker woke up;
  for an error, a timeout, a release or a cancel, when that was written.
  A ``fence_rejected`` row is no end: it says when the worker learnt that
  it had lost the job, after the end the job's other row records (its
  start is the worker's own estimate).  Of two ends, the first counts.

Every slot change of a gated job happens in a transaction whose clock
(``now()``, the transaction's start) comes no later than its commit: a
claim's start comes after the commit that admitted its job, a completion's
or a retry's end before the commit that frees its slot, and a reclaim's
start after the lease end it found.  So the attempts that held a live lease
at one instant are at most the slots held then, and the limits bound them.

An attempt holds from its start up to, not including, its end: one that
ends when another starts does not overlap it.  An attempt of no length
holds its one instant.  An attempt the history does not place (no row, no
end) fails the check: what cannot be counted proves nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pgfence.tools.loadtest.mix import Limit

#: Offending attempts listed per limit exceeded, and attempts left unplaced.
LIST_LIMIT = 50
MICROSECOND = dt.timedelta(microseconds=1)


def max_overlap(intervals: Iterable[tuple[float, float]]) -> tuple[int, float | None]:
    """The most intervals that hold one instant, and the first instant that
    many hold (None without intervals).  An interval ``(start, end)`` holds
    from ``start`` up to, not including, ``end``: touching intervals do not
    overlap; one of no length holds its instant.  ValueError if an interval
    ends before it starts."""
    events: list[tuple[float, int, int]] = []
    for start, end in intervals:
        if end < start:
            raise ValueError(f"an interval ends before it starts: ({start!r}, {end!r})")
        # At one instant: the ends of intervals with a length first, then
        # the starts, then the ends of intervals of no length.
        events += [(start, 1, 1), (end, 0 if end > start else 2, -1)]
    events.sort()
    best, at, now = 0, None, 0
    for t, _order, step in events:
        now += step
        if now > best:
            best, at = now, t
    return best, at


def holds(start: float, end: float, t: float) -> bool:
    """Whether the interval (start, end) holds the instant ``t``, as
    :func:`max_overlap` counts it."""
    return start <= t < end or start == end == t


@dataclass(frozen=True)
class Held:
    """One attempt, from its claim to the end of its live lease."""

    job: int
    attempt: int
    start: dt.datetime
    end: dt.datetime
    #: How it ended: done, or its pgfence.job_attempts outcome.
    ended: str


def place(jobs: list[dict[str, Any]], attempts: list[dict[str, Any]],
          ids: Iterable[int]) -> tuple[list[Held], list[dict[str, Any]]]:
    """The attempts of the jobs ``ids`` placed in time, and those the
    history does not place (job, attempt, why)."""
    wanted = set(ids)
    recorded: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in attempts:
        if row["job_id"] in wanted:
            recorded.setdefault((row["job_id"], row["attempt"]), []).append(row)
    placed: list[Held] = []
    unplaced: list[dict[str, Any]] = []
    for j in jobs:
        if j["id"] not in wanted:
            continue
        for n in range(1, j["attempt"] + 1):
            if n == j["attempt"] and j["status"] == "done":
                if j["started_at"] is None or j["finished_at"] is None:
                    unplaced.append({"job": j["id"], "attempt": n, "why": "done without its start or end"})
                else:
                    placed.append(Held(j["id"], n, j["started_at"], max(j["started_at"], j["finished_at"]),
                                       "done"))
                continue
            rows = recorded.get((j["id"], n), [])
            own = [r for r in rows if r["outcome"] != "fence_rejected" and r["started_at"] is not None]
            if not own:
                if n == j["attempt"] and j["status"] == "running":
                    why = "still running"
                elif not rows:
                    why = "no row in pgfence.job_attempts"
                else:
                    why = "no end of its lease in pgfence.job_attempts, only " + ", ".join(sorted(
                        r["outcome"] + ("" if r["started_at"] is not None else " without a start") for r in rows))
                unplaced.append({"job": j["id"], "attempt": n, "why": why})
                continue
            first = min(own, key=lambda r: r["ended_at"])
            placed.append(Held(j["id"], n, first["started_at"], max(first["started_at"], first["ended_at"]),
                               first["outcome"]))
    return placed, unplaced


def _micros(t: dt.datetime, zero: dt.datetime) -> int:
    return (t - zero) // MICROSECOND


def _peak(held: list[Held], zero: dt.datetime) -> tuple[int, int | None]:
    most, at = max_overlap((_micros(h.start, zero), _micros(h.end, zero)) for h in held)
    return most, None if at is None else int(at)


def _seconds(micros: int | None) -> float | None:
    return None if micros is None else round(micros / 1e6, 6)


def _holders(held: list[Held], at: int, zero: dt.datetime) -> list[dict[str, Any]]:
    return [{"job": h.job, "attempt": h.attempt, "start": _seconds(_micros(h.start, zero)),
             "end": _seconds(_micros(h.end, zero)), "ended": h.ended}
            for h in held if holds(_micros(h.start, zero), _micros(h.end, zero), at)][:LIST_LIMIT]


def measure(name: str, limit: Limit, held: list[Held], keys: dict[int, str],
            zero: dt.datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The maxima of one limited mix (at once in all, at once of one key)
    and each limit they exceed, with the attempts that held then (times in
    seconds from ``zero``)."""
    most, at = _peak(held, zero)
    entry: dict[str, Any] = {"mix": name, **limit.describe(name), "attempts": len(held),
                             "max_concurrent": most, "max_concurrent_at": _seconds(at)}
    over: list[dict[str, Any]] = []
    if limit.concurrency is not None and most > limit.concurrency and at is not None:
        over.append({"mix": name, "kind": entry["kind"], "scope": "kind", "key": None, "limit": limit.concurrency,
                     "max": most, "at": _seconds(at), "holders": _holders(held, at, zero)})
    if limit.keys:
        by_key: dict[str, list[Held]] = {}
        for h in held:
            by_key.setdefault(keys.get(h.job, ""), []).append(h)
        peaks = sorted(((*_peak(hs, zero), key) for key, hs in by_key.items()), key=lambda p: (-p[0], p[2]))
        entry.update(max_per_key=peaks[0][0] if peaks else 0, max_per_key_key=peaks[0][2] if peaks else None,
                     max_per_key_at=_seconds(peaks[0][1]) if peaks else None, keys_used=len(by_key))
        for key_most, key_at, key in peaks:
            if limit.per_key is not None and key_most > limit.per_key and key_at is not None:
                over.append({"mix": name, "kind": entry["kind"], "scope": "key", "key": key,
                             "limit": limit.per_key, "max": key_most, "at": _seconds(key_at),
                             "holders": _holders(by_key[key], key_at, zero)})
    return entry, over


def _describe(e: dict[str, Any]) -> str:
    parts = []
    if e["concurrency"] is not None:
        parts.append(f"at most {e['max_concurrent']} at once (limit {e['concurrency']})")
    if e["per_key_concurrency"] is not None:
        parts.append(f"at most {e.get('max_per_key', 0)} of one key (limit {e['per_key_concurrency']}, "
                     f"{e['keys']} keys)")
        if e["concurrency"] is None:
            parts.append(f"{e['max_concurrent']} at once in all")
    return f"{e['mix']} ({e['kind']}): " + ", ".join(parts)


def check(limits: dict[str, Limit], enqueued: dict[int, str], keys: dict[int, str], jobs: list[dict[str, Any]],
          attempts: list[dict[str, Any]], zero: dt.datetime | None) -> dict[str, Any]:
    """The audit's check "concurrency limits": passed when no limit was
    exceeded and every attempt of the limited jobs was placed."""
    maxima: list[dict[str, Any]] = []
    over: list[dict[str, Any]] = []
    unplaced: list[dict[str, Any]] = []
    for name, limit in sorted(limits.items()):
        ids = [job_id for job_id, mix_name in enqueued.items() if mix_name == name]
        held, lost = place(jobs, attempts, ids)
        unplaced += lost
        base = zero or min((h.start for h in held), default=dt.datetime.now(dt.UTC))
        entry, exceeded = measure(name, limit, held, keys, base)
        maxima.append(entry)
        over += exceeded
    detail = "; ".join(_describe(e) for e in maxima)
    detail += f"; {sum(e['attempts'] for e in maxima)} attempt(s) placed, {len(unplaced)} not"
    if over:
        detail = "; ".join(
            f"OVER THE LIMIT: {o['mix']} {o['max']} at once" + (f" of key {o['key']}" if o["scope"] == "key" else "")
            + f" at {o['at']:.3f}s (limit {o['limit']})" for o in over) + "; " + detail
    return {"name": "concurrency limits", "passed": not over and not unplaced, "detail": detail,
            "maxima": maxima, "over": over, "unplaced": unplaced[:LIST_LIMIT], "unplaced_count": len(unplaced)}
