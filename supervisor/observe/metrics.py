"""Every Prometheus metric pgfence records, defined in one module.

Counters are incremented where things happen (the worker, the heartbeat
manager, the arbiter).  Under ``pgfence run`` each process writes them to
the multiprocess directory (see :mod:`supervisor.multiproc`) and the metrics
server sums them; gauges use "live" modes, so a dead process leaves no
series behind.
"""

import bisect
import functools
from collections import Counter as _Tally
from collections.abc import Sequence
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)

RECLAIMS = Counter(
    "pgfence_reclaims",
    "Claims of a job whose previous attempt's lease had expired while it was running.",
    ["queue", "kind"],
)
LEASE_LOST = Counter(
    "pgfence_lease_lost",
    "A worker learned its lease was gone.",
    ["queue", "kind", "reason"],
)
DOUBLE_RUN_PREVENTED = Counter(
    "pgfence_double_run_prevented",
    "Completions or failure reports rejected by the fence, their writes rolled back.",
    ["queue", "kind"],
)
JOBS_CLAIMED = Counter("pgfence_jobs_claimed", "Jobs claimed.", ["queue", "kind"])
JOBS_COMPLETED = Counter("pgfence_jobs_completed", "Jobs completed through the fence.", ["queue", "kind"])
JOBS_RETRIED = Counter("pgfence_jobs_retried", "Failed attempts put back for a retry.", ["queue", "kind"])
JOBS_FAILED = Counter("pgfence_jobs_failed", "Jobs that ended failed.", ["queue", "kind"])
JOBS_RELEASED = Counter("pgfence_jobs_released", "Claimed jobs handed back (shutdown or worker death).",
                        ["queue", "kind"])
UNKNOWN_KIND = Counter(
    "pgfence_unknown_kind",
    "Claims of a job whose kind the worker does not know: put back (no attempt spent), "
    "or failed once older than unknown_kind_timeout.",
    ["queue", "kind"],
)
RATE_LIMITED = Counter(
    "pgfence_jobs_rate_limited",
    "Jobs whose handler raised RateLimited (the service it called said 429): put back until its retry_after, "
    "no attempt spent.",
    ["queue", "kind"],
)
JOB_DURATION = Histogram("pgfence_job_duration_seconds", "Handler run time.", ["queue", "kind"])
JOB_WAIT = Histogram("pgfence_job_wait_seconds", "From run_at to start.", ["queue", "kind"])
HEARTBEAT_DURATION = Histogram("pgfence_heartbeat_duration_seconds", "Time of one batched renewal statement.")

HEARTBEAT_LEASES = Gauge("pgfence_heartbeat_leases", "Leases in the last renewal statement.",
                         multiprocess_mode="livesum")
WORKERS = Gauge("pgfence_workers", "Live worker children.", multiprocess_mode="livesum")
WORKER_RESTARTS = Counter("pgfence_worker_restarts", "Worker children respawned after an unplanned death.")
QUEUE_JOBS = Gauge("pgfence_queue_jobs", "Jobs by queue and status, refreshed at an interval by one process.",
                   ["queue", "status"], multiprocess_mode="livesum")
QUEUE_OLDEST_AGE = Gauge("pgfence_queue_oldest_job_age_seconds",
                         "Age of the oldest queued job whose run_at has come (0 if none).",
                         ["queue"], multiprocess_mode="livemax")
QUEUE_PAUSED = Gauge("pgfence_queue_paused", "1 if the queue is paused (pgfence pause: its jobs are not claimed), "
                     "else 0; refreshed with the queue gauges.", ["queue"], multiprocess_mode="livemax")
JOBS_IN_FLIGHT = Gauge("pgfence_jobs_in_flight", "Jobs the workers hold and run now, by queue.", ["queue"],
                       multiprocess_mode="livesum")
WORKER_CAPACITY = Gauge("pgfence_worker_capacity",
                        "Jobs the workers can run at once (threads, plus async_concurrency with async handlers).",
                        multiprocess_mode="livesum")
WORKER_FREE_SLOTS = Gauge("pgfence_worker_free_slots", "Capacity minus the jobs in flight.",
                          multiprocess_mode="livesum")
CHILDREN_RECYCLED = Counter("pgfence_children_recycled",
                            "Worker children that replaced themselves (not crashes), by reason.", ["reason"])
EVENT_LOOP_BLOCKED = Counter("pgfence_event_loop_blocked",
                             "Times a worker's event loop did not turn for over a second, by the kind running.",
                             ["kind"])

# Vacuum of the jobs table, refreshed by the metrics server with the queue
# gauges (one query: see vacuum_stats in sql/queries/vacuum.sql).
JOBS_DEAD_TUPLES = Gauge("pgfence_jobs_dead_tuples", "Dead row versions in pgfence.jobs (pg_stat_user_tables).",
                         multiprocess_mode="livemax")
JOBS_LIVE_TUPLES = Gauge("pgfence_jobs_live_tuples", "Live row versions in pgfence.jobs (pg_stat_user_tables).",
                         multiprocess_mode="livemax")
JOBS_SINCE_VACUUM = Gauge("pgfence_jobs_last_vacuum_age_seconds",
                          "Seconds since the last VACUUM or autovacuum of pgfence.jobs (since the statistics "
                          "began, if none is recorded).", multiprocess_mode="livemax")
JOBS_AUTOVACUUM = Gauge("pgfence_jobs_autovacuum_enabled",
                        "1 if autovacuum is on for pgfence.jobs, by setting: server (autovacuum and track_counts) "
                        "and table (its autovacuum_enabled option).", ["setting"], multiprocess_mode="livemax")
XMIN_HORIZON_AGE = Gauge("pgfence_xmin_horizon_age_seconds",
                         "Age of the oldest transaction, prepared transaction or replication slot holding the "
                         "xmin horizon of pgfence's database (0 if none).", multiprocess_mode="livemax")
SELF_VACUUMS = Counter("pgfence_self_vacuums",
                       "pgfence's own VACUUMs of pgfence.jobs, by result (done, held: dead rows stayed, skipped: "
                       "the table was being vacuumed).", ["result"])

# Periodic jobs (pgfence.periodic): counted by the supervisor whose
# scheduler decided the tick (each tick is decided once, by one of them).
PERIODIC_TICKS = Counter("pgfence_periodic_ticks",
                         "Ticks of a schedule decided, by outcome: enqueued, skipped (its previous run was still "
                         "queued or running), queued (behind its previous run), missed (no scheduler ran at "
                         "its time, and catch_up left it out).", ["schedule", "outcome"])
PERIODIC_LAG = Histogram("pgfence_periodic_lag_seconds",
                         "From a tick's time to its job's enqueue, on the database clock.", ["schedule"],
                         buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0))
PERIODIC_LAST_RUN_FAILED = Gauge("pgfence_periodic_last_run_failed",
                                 "1 if the schedule's last run that ended (the job of its newest tick, or "
                                 "while that is queued or running, the run before) ended failed, else 0.",
                                 ["schedule"], multiprocess_mode="livemax")
PERIODIC_CLOCK_SKEW = Gauge("pgfence_periodic_host_clock_skew_seconds",
                            "The host's clock minus the database's, as the scheduler last read them (ticks "
                            "follow the database's clock alone).", multiprocess_mode="livemostrecent")

# Concurrency and rate limits (migration 0017), refreshed by the metrics
# server with the queue gauges (one query: limits_list in
# sql/queries/limits.sql).  One series per kind with a limits row, never one
# per concurrency key.
LIMIT_SLOTS_IN_USE = Gauge("pgfence_limit_slots_in_use",
                           "Slots of the kind's limits held now: its gated jobs running (an expired lease "
                           "included, until a reclaim takes the job) or admitted and not yet claimed.",
                           ["kind"], multiprocess_mode="livemax")
LIMIT_CONCURRENCY = Gauge("pgfence_limit_concurrency",
                          "The kind's concurrency limit in force: set at run time (pgfence limits set), else "
                          "declared by its handler; 0 if it has none.", ["kind"], multiprocess_mode="livemax")
LIMIT_PER_KEY_CONCURRENCY = Gauge("pgfence_limit_per_key_concurrency",
                                  "The kind's per-key concurrency limit in force (jobs of one concurrency key at "
                                  "once): set at run time, else declared by its handler; 0 if it has none.",
                                  ["kind"], multiprocess_mode="livemax")
LIMIT_RATE = Gauge("pgfence_limit_rate_per_second",
                   "The kind's rate in force, in job starts a second (its starts over its period: 10/min reads "
                   "0.1667): set at run time, else declared by its handler; 0 if it has none.", ["kind"],
                   multiprocess_mode="livemax")
JOBS_HELD_BACK = Gauge("pgfence_jobs_held_back",
                       "Queued jobs a concurrency or rate limit holds back, by kind and reason: concurrency "
                       "(waiting for a slot or for the rate) or scheduled (held until its run_at).", ["kind", "reason"],
                       multiprocess_mode="livemax")

#: The outcomes of a tick, as used in the ``outcome`` label.
PERIODIC_OUTCOMES = ("enqueued", "skipped", "queued", "missed")

#: The results of pgfence's own VACUUM, as used in the ``result`` label.
SELF_VACUUM_RESULTS = ("done", "held", "skipped")

#: Why a job is held back, as used in the ``reason`` label (the jobs'
#: held_back column).
HELD_BACK_REASONS = ("concurrency", "scheduled")

#: Why a child replaced itself, as used in the ``reason`` label.
RECYCLE_REASONS = ("max_jobs", "max_memory", "timeout", "lost_lease")

#: The reasons a lease is lost, as used in the ``reason`` label.
LOST_REASONS = ("renewal_rejected", "renewal_failed", "expired", "timeout", "cancelled", "fence_rejected")


def initialise(queues: list[str] | tuple[str, ...], kinds: list[str]) -> None:
    """Create every per-job counter at 0 for the queues and kinds served.

    A counter series that is born at 1 hides its first increment from
    Prometheus's ``increase()``; born at 0, the first reclaim or rejected
    completion shows on the dashboard and fires the alerts.
    """
    for queue in queues:
        for kind in kinds:
            for counter in (RECLAIMS, DOUBLE_RUN_PREVENTED, JOBS_CLAIMED, JOBS_COMPLETED, JOBS_RETRIED,
                            JOBS_FAILED, JOBS_RELEASED):
                counter.labels(queue, kind)
            for reason in LOST_REASONS:
                LEASE_LOST.labels(queue, kind, reason)
    WORKER_RESTARTS.inc(0)
    for reason in RECYCLE_REASONS:
        CHILDREN_RECYCLED.labels(reason)
    for result in SELF_VACUUM_RESULTS:
        SELF_VACUUMS.labels(result)


def initialise_schedules(names: list[str]) -> None:
    """Create the periodic counters at 0 for the schedules declared."""
    for name in names:
        for outcome in PERIODIC_OUTCOMES:
            PERIODIC_TICKS.labels(name, outcome)
        PERIODIC_LAST_RUN_FAILED.labels(name).set(0)


@functools.cache
def of(metric: _Metric, *labels: str) -> _Metric:
    """``metric.labels(*labels)``, looked up once: on the per-job path the
    lookup (a lock and a dict) cost as much as the increment."""
    return metric.labels(*labels)


def observe_many(child: Histogram, values: Sequence[float]) -> None:
    """``child.observe(v)`` for every value, as one increment of the sum and
    one per bucket touched: a batch of 200 jobs costs a few writes to the
    multiprocess files instead of 400 (each write takes a lock and checks
    the pid).  Falls back to one observe per value should the client's
    Histogram internals ever change shape."""
    if not values:
        return
    try:
        bounds, buckets, total = child._upper_bounds, child._buckets, child._sum
    except AttributeError:
        for value in values:
            child.observe(value)
        return
    # observe() counts a value in the first bucket whose bound is >= it.
    for index, count in _Tally(bisect.bisect_left(bounds, v) for v in values).items():
        buckets[index].inc(count)
    total.inc(sum(values))
