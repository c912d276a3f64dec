"""Loads the named SQL blocks of ``sql/queries/*.sql`` once, into a dict.

A block starts with ``-- name: NAME``, followed by comment lines that
describe it, then the statement with ``%(param)s`` placeholders.  Keeping the
SQL in files lets every query be read, reviewed and EXPLAINed as SQL.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*(\S+)\s*$")


def sql_dir() -> Path:
    """The folder holding ``migrations/`` and ``queries/``.

    In a source checkout (or an editable install) it is the repository's
    ``sql/``; in an installed wheel it is packaged as ``supervisor/sql``.
    """
    here = Path(__file__).resolve().parent.parent / "sql"
    if (here / "queries").is_dir():
        return here
    return Path(str(importlib.resources.files("supervisor.sql")))


def parse(text: str) -> dict[str, str]:
    """Split one ``.sql`` file into its named blocks."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            name = match.group(1)
            if name in blocks:
                raise ValueError(f"query {name!r} defined twice")
            current = blocks[name] = []
        elif current is not None:
            current.append(line)
    out = {}
    for name, lines in blocks.items():
        body = [ln for ln in lines if not ln.lstrip().startswith("--") or ln.strip() == ""]
        sql = "\n".join(body).strip()
        out[name] = sql[:-1] if sql.endswith(";") and sql.count(";") == 1 else sql
    return out


@functools.cache
def all_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    for path in sorted((sql_dir() / "queries").glob("*.sql")):
        for name, sql in parse(path.read_text()).items():
            if name in queries:
                raise ValueError(f"query {name!r} defined twice")
            queries[name] = sql
    return queries


def q(name: str) -> str:
    """The SQL text of the named query."""
    return all_queries()[name]
