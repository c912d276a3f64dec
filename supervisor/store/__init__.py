"""The database seam: connections, the named SQL queries, migrations and
the embedded server."""
