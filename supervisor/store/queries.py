"""Loads the named SQL blocks of ``sql/queries/*.sql`` once, into a dict.

A block starts with ``-- name: NAME``, followed by comment lines that
describe it, then the statement with ``%(param)s`` placeholders.  Keeping the
SQL in files lets every query be read, reviewed and EXPLAINed as SQL.

The product's statements are :func:`q`'s.  A part of the package that is not
the product (the demo and the load test, in ``pgfence.tools``) keeps its
``.sql`` file beside its code and reads it through :func:`queries_in`, the
same loader and the same typed seam.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Callable, Iterable
from importlib.resources.abc import Traversable
from typing import LiteralString, cast

from pgfence.errors import PgfenceError

_NAME = re.compile(r"^--\s*name:\s*(\S+)\s*$")

def sql_dir() -> Traversable:
    """The folder holding ``migrations/`` and ``queries/``, as a Traversable.

    The repository's ``sql/`` is the package ``pgfence.sql`` (mapped by
    ``package-dir``), found through ``importlib.resources`` alone, in a wheel
    and in an editable install alike.  Read it only through the Traversable
    API (``joinpath``, ``iterdir``, ``read_text``), never through its text.
    """
    try:
        return importlib.resources.files("pgfence.sql")
    except ModuleNotFoundError:
        raise PgfenceError("pgfence is installed without its SQL files (pgfence.sql): reinstall it") from None


def sql_files(folder: str) -> list[Traversable]:
    """The ``.sql`` files of ``sql/<folder>``, sorted by name."""
    found = [f for f in sql_dir().joinpath(folder).iterdir() if f.name.endswith(".sql") and f.is_file()]
    return sorted(found, key=lambda f: f.name)


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
    out: dict[str, str] = {}
    for name, lines in blocks.items():
        body = [ln for ln in lines if not ln.lstrip().startswith("--") or ln.strip() == ""]
        sql = "\n".join(body).strip()
        out[name] = sql[:-1] if sql.endswith(";") and sql.count(";") == 1 else sql
    return out


def parse_files(files: Iterable[Traversable]) -> dict[str, str]:
    """The named blocks of every file of ``files``; a name defined twice,
    in one file or in two, is refused."""
    queries: dict[str, str] = {}
    for file in files:
        for name, sql in parse(file.read_text(encoding="utf-8")).items():
            if name in queries:
                raise ValueError(f"query {name!r} defined twice")
            queries[name] = sql
    return queries


@functools.cache
def all_queries() -> dict[str, str]:
    return parse_files(sql_files("queries"))


def _literal(sql: str) -> LiteralString:
    """Typed ``LiteralString``: the text comes from the package's own ``.sql``
    files, never from input, so a type checker that implements PEP 675 lets
    it through to psycopg while it still rejects SQL built with an f-string
    at a call site."""
    # mypy does not implement PEP 675 (to it LiteralString is str), so it
    # calls this cast redundant; checkers that do implement it need it.
    return cast(LiteralString, sql)  # type: ignore[redundant-cast]


def q(name: str) -> LiteralString:
    """The SQL text of the named query of ``sql/queries``."""
    return _literal(all_queries()[name])


def queries_in(package: str, filename: str) -> Callable[[str], LiteralString]:
    """A :func:`q` for the named blocks of one ``.sql`` file shipped as a
    resource of ``package`` (``queries_in(__package__, "demo.sql")``),
    read on first use."""

    @functools.cache
    def blocks() -> dict[str, str]:
        return parse_files([importlib.resources.files(package).joinpath(filename)])

    def named(name: str) -> LiteralString:
        return _literal(blocks()[name])

    return named
