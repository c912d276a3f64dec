"""Claiming, running and completing jobs: the worker loop, its leases,
the kinds it serves and the pruning of finished jobs."""
