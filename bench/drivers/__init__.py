"""Job workers the benchmark runs as processes of their own, one module per
system: pgqueuer and procrastinate through their public APIs, and the naive
psycopg loop.  Each has ``setup`` (schema and N no-op jobs) and ``work``
(drain the queue, then exit).  The enqueue section's producers time the
systems' enqueue calls instead (``pgfence_enqueue``, ``enqueue_peers``, on
the clock of ``enqueue_clock``)."""
