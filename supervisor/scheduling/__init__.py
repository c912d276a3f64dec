"""Periodic jobs (``pgfence.periodic()`` declares one): schedules declared in code or settings, and the scheduler
that enqueues each of their ticks exactly once across every supervisor.

- :mod:`.schedule`: a schedule and its ticks (pure; cron through cronsim);
- :mod:`.plan`: which ticks a round decides and how (pure);
- :mod:`.declared`: the schedules this process declares;
- :mod:`.scheduler`: the scheduler thread of the heartbeat process.
"""
