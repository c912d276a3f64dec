"""The reference pages' generated parts, read from pgfence's own declarations.

Each function returns Markdown.  Nothing here holds a copy of what it shows:
the settings come from ``pgfence.settings`` (through
``pgfence.settings_table``), the command line from the parser
(``pgfence.cli.parser``), the metrics from ``pgfence.observe.metrics`` and the
SQL functions from the migrations in ``sql/migrations``.  The docs' hook
(``hooks.py`` beside this file) puts them in place of the markers in the
pages, and the tests read the same functions.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = REPO / "sql" / "migrations"


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


# -- settings ------------------------------------------------------------------------


def settings_table() -> str:
    from pgfence import settings_table

    return settings_table.render()


# -- the command line ----------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of every sub-command, in the parser's order."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    return [(name, helps.get(name, ""), p) for name, p in sub.choices.items()]


def _metavar(action: argparse.Action) -> str:
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    if action.metavar:
        return str(action.metavar)
    return action.dest.upper() if action.option_strings else action.dest


def _positional(action: argparse.Action) -> str:
    shown = _metavar(action).upper() if not action.choices else _metavar(action)
    if action.nargs == "*":
        return f"[{shown} ...]"
    if action.nargs == "+":
        return f"{shown} ..."
    return shown


def _option_names(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{_positional(action)}`"
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return ", ".join(f"`{name}`" for name in action.option_strings)
    return ", ".join(f"`{name} {_metavar(action)}`" for name in action.option_strings)


def _option_help(action: argparse.Action) -> str:
    return _cell((action.help or "").replace("%%", "%"))


def cli_commands() -> list[str]:
    """The name of every sub-command of ``pgfence``."""
    from pgfence.cli.parser import build_parser

    return [name for name, _help, _parser in _subcommands(build_parser())]


def cli_reference() -> str:
    """One section per sub-command: what it does, and a table of its
    arguments and options with their help, as ``pgfence COMMAND --help``
    shows them (hidden options left out)."""
    from pgfence.cli.parser import build_parser

    out: list[str] = []
    for name, text, sub in _subcommands(build_parser()):
        actions = [a for a in sub._actions
                   if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        positionals = [_positional(a) for a in actions if not a.option_strings]
        synopsis = " ".join([f"pgfence {name}"] + (["[options]"] if any(a.option_strings for a in actions) else [])
                            + positionals)
        out += [f"### `pgfence {name}`", "", _cell(text[:1].upper() + text[1:]) + ".", "",
                f"```text\n{synopsis}\n```", ""]
        if actions:
            out += ["| argument or option | meaning |", "|---|---|"]
            out += [f"| {_option_names(a)} | {_option_help(a)} |" for a in actions]
            out.append("")
    return "\n".join(out)


# -- metrics -------------------------------------------------------------------------


def metrics_table() -> str:
    """Every metric of ``pgfence.observe.metrics``, in the order it is
    defined there: its exposed name, type, labels (with the values a label
    takes, where the module declares them) and help text."""
    from prometheus_client.metrics import MetricWrapperBase

    from pgfence.observe import metrics

    values = {
        ("pgfence_lease_lost", "reason"): metrics.LOST_REASONS,
        ("pgfence_children_recycled", "reason"): metrics.RECYCLE_REASONS,
        ("pgfence_self_vacuums", "result"): metrics.SELF_VACUUM_RESULTS,
        ("pgfence_periodic_ticks", "outcome"): metrics.PERIODIC_OUTCOMES,
    }
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name = metric._name + ("_total" if metric._type == "counter" else "")
        labels = []
        for label in metric._labelnames:
            taken = values.get((metric._name, label))
            labels.append(f"{label} ({', '.join(f'`{v}`' for v in taken)})" if taken else label)
        lines.append(f"| `{name}` | {metric._type} | {', '.join(labels)} | {_cell(metric._documentation)} |")
    return "\n".join(lines) + "\n"


# -- SQL functions -------------------------------------------------------------------


@dataclass(frozen=True)
class SqlFunction:
    """One function of schema pgfence, as the migrations define it."""

    name: str
    #: The ``CREATE FUNCTION`` statement's head, from its latest definition:
    #: name, parameters with their defaults, and what it returns.
    signature: str
    #: The comment above its first definition, which says what it is for.
    comment: str
    #: The migrations that define it, first to latest.
    migrations: tuple[str, ...]
    returns_trigger: bool


_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION (pgfence\.\w+)\s*\(", re.MULTILINE)


def _head(text: str, start: int) -> str:
    """The statement from ``start`` up to the language clause or body."""
    end = min(i for i in (text.find(" AS $", start), text.find("\nLANGUAGE", start), text.find("\nAS $", start))
              if i >= 0)
    return text[start:end].strip()


def _comment_above(text: str, start: int) -> str:
    lines = text[:start].rstrip("\n").split("\n")
    comment: list[str] = []
    while lines and lines[-1].startswith("--"):
        comment.insert(0, lines.pop()[2:].strip())
    return " ".join(line for line in comment if line)


def sql_functions(folder: Path = MIGRATIONS) -> dict[str, SqlFunction]:
    """Every function the migrations create in schema pgfence, by name."""
    found: dict[str, SqlFunction] = {}
    for path in sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        text = path.read_text(encoding="utf-8")
        for match in _CREATE.finditer(text):
            name = match.group(1)
            head = _head(text, match.start())
            head = re.sub(r"^CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", head)
            before = found.get(name)
            found[name] = SqlFunction(
                name=name, signature=head,
                comment=before.comment if before else _comment_above(text, match.start()),
                migrations=(before.migrations if before else ()) + (path.stem,),
                returns_trigger=bool(re.search(r"RETURNS\s+trigger", head)))
    return found


def sql_function(name: str) -> str:
    """The signature of one function, as a code block, and the migrations
    that define it."""
    function = sql_functions()[name]
    made = function.migrations[0]
    since = f"Created by migration `{made}`"
    if len(function.migrations) > 1:
        since += ", replaced by " + ", ".join(f"`{m}`" for m in function.migrations[1:])
    return f"```sql\n{function.signature}\n```\n\n{since} (`sql/migrations/`).\n"


def sql_other_functions(documented: set[str]) -> str:
    """A table of the functions not in ``documented``: pgfence's own, with
    the first sentence of the comment that explains each."""
    lines = ["| function | used by | what it does |", "|---|---|---|"]
    for function in sql_functions().values():
        if function.name in documented:
            continue
        # The comment's first sentence, without the name it may start with.
        comment = re.sub(rf"^{re.escape(function.name.split('.')[1])}(?: \\(\\d+\\))?: ", "", function.comment)
        first = re.split(r"(?<=\.)\s", comment, maxsplit=1)[0]
        user = "a trigger on `pgfence.jobs`" if function.returns_trigger else "pgfence's workers and maintenance"
        lines.append(f"| `{function.name}` | {user} | {_cell(first)} |")
    return "\n".join(lines) + "\n"
