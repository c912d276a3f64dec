"""The job mix: which jobs a load test enqueues and how each must end.

``--mix noop=40,sleep=30,fail=10,effect=10,receipt=10`` gives weights; the
M jobs are split by largest remainder, so the counts are exact and the same
for the same M and mix.  Durations (``sleep``, ``effect``, ``asleep`` and
``aeffect`` seconds, ``receipt`` render seconds) are drawn from an
exponential distribution with mean ``--sleep-mean``, cut at ``--sleep-max``,
from the run's seeded random generator.

``asleep`` and ``aeffect`` are the async counterparts of ``sleep`` and
``effect`` (``pgfence.handlers.aio``: ``async_sleep``, ``async_effect``),
run on each worker's event loop; an ``aeffect`` job writes its one effect
row through the fence into the same table as ``effect``, audited the same
way.

Jobs other than ``fail`` get room for the faults the run injects on purpose
(``max_attempts`` 10, ``max_reclaims`` 8), so a job hit by several faults is
not quarantined; ``fail`` jobs get ``max_attempts`` 2: one retry, then failed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pgfence.errors import ConfigError

#: Mix name -> the bundled handler's kind.
KINDS = {"noop": "noop", "sleep": "sleep", "fail": "fail", "effect": "effect", "receipt": "send_receipt",
         "asleep": "async_sleep", "aeffect": "async_effect"}
#: Mix name -> the final status every such job must reach.
EXPECTED = {"noop": "done", "sleep": "done", "fail": "failed", "effect": "done", "receipt": "done",
            "asleep": "done", "aeffect": "done"}
#: Mixes run by async def handlers (module pgfence.handlers.aio).
ASYNC = frozenset({"asleep", "aeffect"})
#: Mixes that write one effect row (pgfence_examples.effects) through the fence.
EFFECTS = ("effect", "aeffect")
#: The handler modules every run loads, and the one async mixes add.
HANDLERS = ("pgfence.handlers.builtin", "pgfence.handlers.receipts")
ASYNC_HANDLERS = "pgfence.handlers.aio"

MAX_ATTEMPTS = 10
MAX_RECLAIMS = 8
FAIL_MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class JobSpec:
    mix: str
    kind: str
    payload: dict[str, Any]
    max_attempts: int
    max_reclaims: int


def parse(text: str) -> dict[str, int]:
    """``noop=40,sleep=30`` -> {"noop": 40, "sleep": 30}; ConfigError if bad."""
    weights: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"invalid --mix: {part!r} is not NAME=WEIGHT (names: {', '.join(KINDS)})")
        if name not in KINDS:
            raise ConfigError(f"invalid --mix: unknown job type {name!r} (known: {', '.join(KINDS)})")
        if name in weights:
            raise ConfigError(f"invalid --mix: {name!r} given twice")
        try:
            weight = int(value.strip())
        except ValueError:
            raise ConfigError(f"invalid --mix: the weight of {name!r} must be a whole number, got {value!r}") from None
        if weight < 0:
            raise ConfigError(f"invalid --mix: the weight of {name!r} must be 0 or more, got {weight}")
        weights[name] = weight
    if sum(weights.values()) <= 0:
        raise ConfigError("invalid --mix: give at least one job type a positive weight")
    return weights


def needs_async(weights: dict[str, int]) -> bool:
    """Some job of the mix runs on the workers' event loop."""
    return any(weights.get(name, 0) > 0 for name in ASYNC)


def handler_modules(weights: dict[str, int]) -> list[str]:
    """The supervisors' ``--handlers``: the async module only when the mix
    has async jobs (loading it starts an event loop in every worker)."""
    return [*HANDLERS, *([ASYNC_HANDLERS] if needs_async(weights) else [])]


def allocate(total: int, weights: dict[str, int]) -> dict[str, int]:
    """Split ``total`` jobs by weight, largest remainder first (ties in the
    order of KINDS); every mix name gets an entry."""
    whole = sum(weights.values())
    exact = {name: total * weights.get(name, 0) / whole for name in KINDS}
    counts = {name: int(share) for name, share in exact.items()}
    order = sorted(KINDS, key=lambda n: (-(exact[n] - counts[n]), list(KINDS).index(n)))
    for name in order[: total - sum(counts.values())]:
        counts[name] += 1
    return counts


def duration(rng: random.Random, mean: float, cap: float) -> float:
    if mean <= 0 or cap <= 0:
        return 0.0
    return round(min(cap, rng.expovariate(1.0 / mean)), 3)


def make_jobs(counts: dict[str, int], rng: random.Random, *, sleep_mean: float, sleep_max: float) -> list[JobSpec]:
    """The jobs to enqueue, in a seeded random order."""
    jobs: list[JobSpec] = []
    for name, count in counts.items():
        for n in range(count):
            jobs.append(_job(name, n, rng, sleep_mean, sleep_max))
    rng.shuffle(jobs)
    return jobs


def _job(name: str, n: int, rng: random.Random, mean: float, cap: float) -> JobSpec:
    attempts, reclaims = MAX_ATTEMPTS, MAX_RECLAIMS
    if name == "noop":
        payload: dict[str, Any] = {}
    elif name in ("sleep", "effect", "asleep", "aeffect"):
        payload = {"seconds": duration(rng, mean, cap)}
    elif name == "fail":
        payload = {"message": "loadtest: fails on purpose"}
        attempts = FAIL_MAX_ATTEMPTS
    else:
        payload = {"order_id": f"lt-{n}", "email": f"lt-{n}@example.invalid",
                   "amount_cents": rng.randint(100, 100_000), "render_seconds": duration(rng, mean, cap)}
    return JobSpec(name, KINDS[name], payload, attempts, reclaims)
