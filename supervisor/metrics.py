"""Every Prometheus metric pgfence records, defined in one module.

Counters are incremented where things happen (the worker, the heartbeat
manager); serving them from many processes is the supervisor's business.
"""

from prometheus_client import Counter, Histogram

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
JOBS_RELEASED = Counter("pgfence_jobs_released", "Claimed jobs handed back (shutdown or worker death).", ["queue", "kind"])
JOB_DURATION = Histogram("pgfence_job_duration_seconds", "Handler run time.", ["queue", "kind"])
JOB_WAIT = Histogram("pgfence_job_wait_seconds", "From run_at to start.", ["queue", "kind"])
HEARTBEAT_DURATION = Histogram("pgfence_heartbeat_duration_seconds", "Time of one batched renewal statement.")

#: The reasons a lease is lost, as used in the ``reason`` label.
LOST_REASONS = ("renewal_rejected", "renewal_failed", "timeout", "cancelled", "fence_rejected")
