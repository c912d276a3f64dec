"""``pgfence loadtest``: many jobs, several supervisors, faults, then an audit.

The run, in order (:mod:`.runner`):

1. the database: the one named as for other commands (loopback or a Unix
   socket only), or with ``--embedded`` a throwaway PostgreSQL in a temp dir;
2. a local email API (:mod:`supervisor.mailsink`), a blackholing TCP proxy
   in front of PostgreSQL (:mod:`.proxy`), optionally PgBouncer in front of
   the proxy (:mod:`.pgbouncer`);
3. S ``pgfence run`` processes (:mod:`.fleet`) on a queue of the run's own;
4. M jobs of the chosen mix (:mod:`.mix`), enqueued at once;
5. faults at seeded random times (:mod:`.faults`) until every job has ended;
6. every supervisor's /metrics scraped just before it is stopped, the audit
   (:mod:`.audit`, the concurrency limits in :mod:`.audit_limits`) and the
   report (:mod:`.report`); exit status 1 if a check fails.

Examples::

    # every fault, its own throwaway server (so the restart fault too)
    pgfence loadtest --embedded --jobs 2000 --faults all --fault-interval 3 --seed 1

    # many jobs per worker: 8 threads and a 50-slot event loop per child,
    # async jobs in the mix, every fault
    pgfence loadtest --threads 8 --async-concurrency 50 --faults all \
        --mix noop=20,sleep=20,asleep=20,effect=15,aeffect=15,fail=10

    # concurrency limits under faults: at most 3 limited jobs at once, at
    # most 1 keyed job of one key at once over 50 keys; the audit proves it
    pgfence loadtest --faults stop,kill,partition \
        --mix noop=40,limited=30@3,keyed=30@1/50

    # the large run: 256 workers through PgBouncer in transaction pooling
    # (Debian: apt-get install pgbouncer), a chart of it
    pgfence loadtest --dsn postgresql://postgres@127.0.0.1/app --pgbouncer \
        --supervisors 8 --workers 32 --jobs 20000 --faults all --fault-interval 5 \
        --timeout 600 --plot run.png
"""
