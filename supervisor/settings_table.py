"""The settings table of the documentation (docs/reference/settings.md),
generated from the declarations in :mod:`pgfence.settings`.

The docs' build renders it in place of the page's marker, so the table
cannot differ from the code; ``python -m pgfence.settings_table`` prints it.
"""

from __future__ import annotations

import sys

from pgfence.settings import DECLARATIONS, Declaration


def _row(declared: Declaration) -> str:
    source = f"`{declared.flag}`, `{declared.env}`"
    if declared.is_boolean:
        source = f"`{declared.flag}`/`--no-{declared.flag[2:]}`, `{declared.env}`"
    meaning = declared.doc + (f"; {declared.range}" if declared.range else "")
    if not declared.commands:
        source = f"TOML only (or `{declared.env}`)"
    commands = ", ".join(declared.commands) or "run"
    # A value is code; a description of the default ("a third of each lease") is prose.
    shown = declared.shown if " " in declared.shown else f"`{declared.shown}`"
    return f"| `{declared.name}` | {shown} | {source} | {commands} | {meaning} |"


def render() -> str:
    """The table, in Markdown, one row per setting that users set."""
    lines = ["| setting | default | flag, environment | commands | meaning |", "|---|---|---|---|---|"]
    lines += [_row(d) for d in DECLARATIONS.values() if not d.hidden]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv:
        sys.stderr.write("usage: python -m pgfence.settings_table  (prints the settings table)\n")
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
