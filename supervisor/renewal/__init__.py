"""Lease renewal: the shared heartbeat manager that renews every running
job's lease in one statement, and the process it runs in."""
