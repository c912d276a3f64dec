"""The tables the example handlers write, and their inserts:
``pgfence_examples.effects`` (the ``effect`` kind of
:mod:`pgfence.handlers.builtin`) and ``pgfence_examples.receipts``
(:mod:`pgfence.handlers.receipts`).

They live in a schema of their own, created here and not by ``pgfence
migrate``: your database gets pgfence's tables only.  Create them before a
worker runs those kinds::

    python -m pgfence.handlers.tables postgresql://...
"""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

import psycopg

#: The schema of the examples' tables.
SCHEMA = "pgfence_examples"

#: Serialises concurrent creators (two test runs, a load test's supervisors):
#: CREATE ... IF NOT EXISTS alone can still collide on the catalog's unique
#: indexes when two sessions create the same table at once.
_LOCK_KEY = 0x7067656C6573   # "pgeles": pgfence examples

#: Record one effect of a job; run inside the job's fenced transaction.
INSERT_EFFECT = """
    INSERT INTO pgfence_examples.effects (job_id, attempt, idempotency_key, worker)
    VALUES (%(job_id)s, %(attempt)s, %(key)s, %(worker)s)"""

#: Record a sent receipt; run inside the job's fenced transaction.
INSERT_RECEIPT = """
    INSERT INTO pgfence_examples.receipts (job_id, attempt, idempotency_key, order_id, email, amount_cents,
                                           sent_status)
    VALUES (%(job_id)s, %(attempt)s, %(key)s, %(order_id)s, %(email)s, %(amount_cents)s, %(sent_status)s)"""


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the schema and the tables if they do not exist (idempotent)."""
    ddl = resources.files("pgfence.handlers").joinpath("tables.sql").read_text(encoding="utf-8")
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(ddl)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pgfence.handlers.tables DSN", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(argv[0], autocommit=True) as conn:
            create_tables(conn)
    except psycopg.Error as exc:
        # The driver's text names the host, never the password.
        detail = str(exc).strip().splitlines()
        print(f"pgfence: error: cannot create the example tables: {detail[0] if detail else type(exc).__name__}",
              file=sys.stderr)
        return 1
    print(f"the tables of schema {SCHEMA} exist")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
