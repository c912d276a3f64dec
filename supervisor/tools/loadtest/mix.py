"""The job mix: which jobs a load test enqueues and how each must end.

``--mix noop=40,sleep=30,fail=10,effect=10,receipt=10`` gives weights; the
M jobs are split by largest remainder, so the counts are exact and the same
for the same M and mix.  Durations (``sleep``, ``effect``, ``asleep``,
``aeffect``, ``limited`` and ``keyed`` seconds, ``receipt`` render seconds)
are drawn from an exponential distribution with mean ``--sleep-mean``, cut at
``--sleep-max``, from the run's seeded random generator.

``asleep`` and ``aeffect`` are the async counterparts of ``sleep`` and
``effect`` (``pgfence.handlers.aio``: ``async_sleep``, ``async_effect``),
run on each worker's event loop; an ``aeffect`` job writes its one effect
row through the fence into the same table as ``effect``, audited the same
way.

``limited`` and ``keyed`` jobs work like ``sleep`` under a concurrency
limit, declared by the handlers the load test registers for them
(:mod:`.handlers`, ``@handler(concurrency=..., per_key_concurrency=...)``):

- ``limited=W@N``: weight W, at most N such jobs at once across every
  supervisor;
- ``keyed=W@N/K``: at most N at once of one concurrency key, the jobs spread
  over K keys in turn (``k0`` .. ``k{K-1}``); ``keyed=W@M:N/K`` caps the
  kind at M at once too.

Their kind names carry their limits (``loadtest_limited_c3``,
``loadtest_keyed_p1``, ``loadtest_keyed_c4_p1``): limits are per kind in
the whole database, so two runs with other limits never share a kind.  The
audit (:mod:`.audit_limits`) proves from the attempt history that no
instant saw more attempts holding a live lease than the limits allow.

Jobs other than ``fail`` get room for the faults the run injects on purpose
(``max_attempts`` 10, ``max_reclaims`` 8), so a job hit by several faults is
not quarantined; ``fail`` jobs get ``max_attempts`` 2: one retry, then failed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pgfence.errors import ConfigError
from pgfence.limits import LIMIT_MAX

#: Mix name -> the bundled handler's kind.
#: (A limited mix's kind is this name with its limits: Limit.kind.)
KINDS = {"noop": "noop", "sleep": "sleep", "fail": "fail", "effect": "effect", "receipt": "send_receipt",
         "asleep": "async_sleep", "aeffect": "async_effect", "limited": "loadtest_limited", "keyed": "loadtest_keyed"}
#: Mix name -> the final status every such job must reach.
EXPECTED = {"noop": "done", "sleep": "done", "fail": "failed", "effect": "done", "receipt": "done",
            "asleep": "done", "aeffect": "done", "limited": "done", "keyed": "done"}
#: Mixes under a concurrency limit, given after the weight (NAME=WEIGHT@LIMITS).
LIMITED = ("limited", "keyed")
#: The form of each limited mix, for the error messages.
LIMIT_FORMS = {"limited": "limited=WEIGHT@N", "keyed": "keyed=WEIGHT@N/KEYS or keyed=WEIGHT@TOTAL:N/KEYS"}
#: The most keys a keyed mix spreads its jobs over.
KEYS_MAX = 1_000_000
#: Mixes run by async def handlers (module pgfence.handlers.aio).
ASYNC = frozenset({"asleep", "aeffect"})
#: Mixes that write one effect row (pgfence_examples.effects) through the fence.
EFFECTS = ("effect", "aeffect")
#: The handler modules every run loads, and the one async mixes add.
HANDLERS = ("pgfence.handlers.builtin", "pgfence.handlers.receipts")
ASYNC_HANDLERS = "pgfence.handlers.aio"
#: The module that registers the limited mixes' kinds (from LIMITS_ENV).
LIMITED_HANDLERS = "pgfence.tools.loadtest.handlers"
#: The environment variable that tells the supervisors' workers those kinds
#: and their limits (encode).
LIMITS_ENV = "PGFENCE_LOADTEST_LIMITS"

MAX_ATTEMPTS = 10
MAX_RECLAIMS = 8
FAIL_MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Limit:
    """The concurrency limits of a limited mix: ``concurrency`` jobs of its
    kind at once (None: no such limit), ``per_key`` of one concurrency key
    at once (None: none), the jobs spread over ``keys`` keys (0: no key)."""

    concurrency: int | None = None
    per_key: int | None = None
    keys: int = 0

    def kind(self, name: str) -> str:
        """The kind of mix ``name`` under these limits: its limits in its
        name, so that runs with other limits never share a kind."""
        return (KINDS[name] + ("" if self.concurrency is None else f"_c{self.concurrency}")
                + ("" if self.per_key is None else f"_p{self.per_key}"))

    def key(self, n: int) -> str | None:
        """The concurrency key of the n-th job of the mix, from 0."""
        return f"k{n % self.keys}" if self.keys else None

    def describe(self, name: str) -> dict[str, Any]:
        return {"kind": self.kind(name), "concurrency": self.concurrency, "per_key_concurrency": self.per_key,
                "keys": self.keys}


@dataclass(frozen=True)
class JobSpec:
    mix: str
    kind: str
    payload: dict[str, Any]
    max_attempts: int
    max_reclaims: int
    concurrency_key: str | None = None


def parse(text: str) -> dict[str, int]:
    """``noop=40,sleep=30`` -> {"noop": 40, "sleep": 30}; ConfigError if bad."""
    return parse_mix(text)[0]


def parse_mix(text: str) -> tuple[dict[str, int], dict[str, Limit]]:
    """``noop=40,limited=20@3,keyed=20@1/50`` -> the weights and the limits
    of the limited mixes given; ConfigError if bad."""
    weights: dict[str, int] = {}
    limits: dict[str, Limit] = {}
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
        value, at, limit_text = value.partition("@")
        if name in LIMITED:
            if not at:
                raise ConfigError(f"invalid --mix: {name!r} needs its limits: {LIMIT_FORMS[name]}")
            limits[name] = _limit(name, limit_text.strip())
        elif at:
            raise ConfigError(f"invalid --mix: {name!r} takes no limits (only {' and '.join(LIMITED)} do)")
        try:
            weight = int(value.strip())
        except ValueError:
            raise ConfigError(f"invalid --mix: the weight of {name!r} must be a whole number, got {value!r}") from None
        if weight < 0:
            raise ConfigError(f"invalid --mix: the weight of {name!r} must be 0 or more, got {weight}")
        weights[name] = weight
    if sum(weights.values()) <= 0:
        raise ConfigError("invalid --mix: give at least one job type a positive weight")
    return weights, limits


def _limit(name: str, text: str) -> Limit:
    """``3`` (limited); ``1/50`` or ``4:1/50`` (keyed)."""
    def whole(what: str, part: str, high: int) -> int:
        try:
            value = int(part.strip())
        except ValueError:
            raise ConfigError(f"invalid --mix: {what} of {name!r} must be a whole number, got {part!r} "
                              f"({LIMIT_FORMS[name]})") from None
        if not 1 <= value <= high:
            raise ConfigError(f"invalid --mix: {what} of {name!r} must be from 1 to {high}, got {value}")
        return value

    if name == "limited":
        return Limit(concurrency=whole("the concurrency", text, LIMIT_MAX))
    total, colon, per_key = text.rpartition(":")
    per, slash, keys = per_key.partition("/")
    if not slash:
        raise ConfigError(f"invalid --mix: {name!r} needs its per-key limit and its keys: {LIMIT_FORMS[name]}, "
                          f"got {text!r}")
    return Limit(concurrency=whole("the concurrency", total, LIMIT_MAX) if colon else None,
                 per_key=whole("the per-key concurrency", per, LIMIT_MAX), keys=whole("the keys", keys, KEYS_MAX))


def encode(limits: dict[str, Limit]) -> str:
    """The limited kinds for LIMITS_ENV: ``kind=concurrency/per_key`` each
    (a limit not given: empty), comma-separated."""
    return ",".join(f"{lim.kind(name)}={'' if lim.concurrency is None else lim.concurrency}/"
                    f"{'' if lim.per_key is None else lim.per_key}" for name, lim in sorted(limits.items()))


def decode(text: str) -> list[tuple[str, int | None, int | None]]:
    """(kind, concurrency, per-key concurrency) from :func:`encode`'s text;
    ConfigError if it is not such text."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        kind, _eq, values = part.strip().partition("=")
        conc, slash, per_key = values.partition("/")
        if not kind or not slash or not all(v.isdigit() or v == "" for v in (conc, per_key)):
            raise ConfigError(f"invalid {LIMITS_ENV}: {part!r} is not KIND=CONCURRENCY/PER_KEY")
        out.append((kind, int(conc) if conc else None, int(per_key) if per_key else None))
    return out


def needs_async(weights: dict[str, int]) -> bool:
    """Some job of the mix runs on the workers' event loop."""
    return any(weights.get(name, 0) > 0 for name in ASYNC)


def handler_modules(weights: dict[str, int]) -> list[str]:
    """The supervisors' ``--handlers``: the async module only when the mix
    has async jobs (loading it starts an event loop in every worker), the
    limited kinds' module only when it has limited jobs."""
    return [*HANDLERS, *([ASYNC_HANDLERS] if needs_async(weights) else []),
            *([LIMITED_HANDLERS] if any(weights.get(name, 0) > 0 for name in LIMITED) else [])]


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


def make_jobs(counts: dict[str, int], rng: random.Random, *, sleep_mean: float, sleep_max: float,
              limits: dict[str, Limit] | None = None) -> list[JobSpec]:
    """The jobs to enqueue, in a seeded random order (a limited mix with
    jobs needs its entry in ``limits``)."""
    jobs: list[JobSpec] = []
    for name, count in counts.items():
        for n in range(count):
            jobs.append(_job(name, n, rng, sleep_mean, sleep_max, (limits or {}).get(name)))
    rng.shuffle(jobs)
    return jobs


def _job(name: str, n: int, rng: random.Random, mean: float, cap: float, limit: Limit | None) -> JobSpec:
    attempts, reclaims = MAX_ATTEMPTS, MAX_RECLAIMS
    if name in LIMITED:
        if limit is None:
            raise ConfigError(f"invalid --mix: {name!r} needs its limits: {LIMIT_FORMS[name]}")
        key = limit.key(n)
        # The payload names the key too: a finished job keeps no concurrency key.
        return JobSpec(name, limit.kind(name), {"seconds": duration(rng, mean, cap), **({"key": key} if key else {})},
                       attempts, reclaims, concurrency_key=key)
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
