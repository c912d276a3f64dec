"""The examples of the documentation (docs/**/*.md and README.md), and how
each one runs: the collector of tests/test_docs_examples.py, pure (no
database, no process).

Every fenced block in ``python``, ``bash``, ``sh``, ``console`` or ``sql`` is an
example, and so is a block of any other language (TOML, YAML) annotated as a
``file``.  How it runs is said by an HTML comment on the line right before
its fence (invisible on the site and on GitHub), directives separated by
``;``::

    <!-- example: continues previous; background until "arbiter started" -->

``not run: REASON``
    The block is not run (the rest of the comment is the reason): only for
    what a CI machine cannot do (a systemd host, a cluster, a container
    engine).  The tests name every such block, so adding one is a
    deliberate change; its ``pgfence`` command lines are still parsed.
``continues previous``
    Runs after the page's previous example, in the same folder and
    database, with the processes it left in the background still running.
    Without it, a block starts afresh.
``file PATH``
    The block is a file the next blocks use, written to PATH in the folder
    (a Python file is compiled, nothing is run).
``empty database``
    The database has no pgfence schema yet (the block runs ``pgfence
    migrate``); otherwise it is migrated, with the example handlers' tables.
``background until "TEXT"`` / ``until GET URL`` / ``until sql "QUERY"``
    The block is one long-running command: it is started, and the next
    blocks run once its output shows TEXT (or URL answers 200, or QUERY's
    first value is true in the database); it gets SIGTERM after the last
    block that continues it and must exit 0.
``exit N``
    The status the block must end with (default 0); for a background
    command, its status after the TERM (``-15``: it ended by that signal, as
    uvicorn does once it has shut down cleanly).
``expect "TEXT"``
    Its output (stdout and stderr) must contain TEXT.
``replace "OLD" with "NEW"``
    Runs with OLD replaced by NEW (a shorter run of the same command).
``env NAME=VALUE``
    An environment variable for this block.
``free port N``
    The block and the ones that continue it run with the port N (in their
    text, environment and ``until GET`` URL) replaced by one that is free,
    so that examples of the documented ports run side by side with anything
    else on the machine.
``needs PROGRAM``
    Skipped, saying so, where PROGRAM is not installed (CI installs it).
``in repository``
    Runs in the repository's root instead of the chain's folder, for a
    command that reads the repository's own files; it must write nothing.

A ``console`` block's ``$ `` lines are the commands; the other lines are
their output, which must appear in order (spaces collapsed; ``...`` stands
for any lines).
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = frozenset({"python", "bash", "sh", "console", "sql"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_COMMENT = re.compile(r"^ *<!-- example: (?P<body>.*?) -->$")


class AnnotationError(ValueError):
    """An annotation that cannot be read, or that stands before no example."""


@dataclass
class Example:
    page: str                      # relative to the repository: docs/how-to/enqueue.md, README.md
    line: int                      # the line of the opening fence, counted from 1
    language: str
    code: str
    not_run: str | None = None
    continues: bool = False
    file: str | None = None
    empty_database: bool = False
    background: tuple[str, str] | None = None      # ("text", TEXT), ("get", URL) or ("sql", QUERY)
    exit: int = 0
    expect: list[str] = field(default_factory=list)
    replace: list[tuple[str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)
    in_repository: bool = False
    free_ports: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def runnable_code(self) -> str:
        code = self.code
        for old, new in self.replace:
            if old not in code:
                raise AnnotationError(f"{self.id}: replace {old!r}: not in the block")
            code = code.replace(old, new)
        return code


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _directives(body: str, where: str) -> list[list[str]]:
    lexer = shlex.shlex(body, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    groups: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token == ";":
                groups.append([])
            else:
                groups[-1].append(token)
    except ValueError as exc:
        raise AnnotationError(f"{where}: {exc}: {body!r}") from None
    return [g for g in groups if g]


def _apply(example: Example, body: str) -> None:
    if body.startswith("not run:"):
        example.not_run = body[len("not run:"):].strip()
        if not example.not_run:
            raise AnnotationError(f"{example.id}: 'not run:' needs a reason")
        return
    for words in _directives(body, example.id):
        match words:
            case ["continues", "previous"]:
                example.continues = True
            case ["file", path]:
                example.file = path
            case ["empty", "database"]:
                example.empty_database = True
            case ["background", "until", "GET", url]:
                example.background = ("get", url)
            case ["background", "until", "sql", query]:
                example.background = ("sql", query)
            case ["background", "until", text]:
                example.background = ("text", text)
            case ["exit", status] if status.lstrip("-").isdigit():
                example.exit = int(status)
            case ["expect", text]:
                example.expect.append(text)
            case ["replace", old, "with", new]:
                example.replace.append((old, new))
            case ["env", assignment] if "=" in assignment:
                name, _, value = assignment.partition("=")
                example.env[name] = value
            case ["needs", program]:
                example.needs.append(program)
            case ["in", "repository"]:
                example.in_repository = True
            case ["free", "port", port] if port.isdigit():
                example.free_ports.append(int(port))
            case _:
                raise AnnotationError(f"{example.id}: unknown directive {' '.join(words)!r}")


def collect(path: Path, root: Path = ROOT) -> list[Example]:
    """The examples of one page, in page order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    page = path.relative_to(root).as_posix()
    found: list[Example] = []
    pending: tuple[int, str] | None = None        # (line, body) of an annotation not yet used
    i = 0
    while i < len(lines):
        comment = _COMMENT.match(lines[i])
        fence = _FENCE.match(lines[i])
        if comment:
            if pending:
                raise AnnotationError(f"{page}:{pending[0]}: an annotation before no example")
            pending = (i + 1, comment["body"])
            i += 1
            continue
        if not fence:
            if pending and lines[i].strip():
                raise AnnotationError(f"{page}:{pending[0]}: an annotation before no example")
            i += 1
            continue
        indent, ticks = len(fence["indent"]), fence["fence"]
        language = fence["info"].strip().split(" ")[0] if fence["info"].strip() else ""
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:end]]
        if language in LANGUAGES or pending:
            example = Example(page=page, line=i + 1, language=language, code="\n".join(body) + "\n")
            if pending:
                if pending[0] != i:
                    raise AnnotationError(f"{page}:{pending[0]}: the annotation must be on the line before the fence")
                _apply(example, pending[1])
            if language not in LANGUAGES and example.file is None:
                raise AnnotationError(f"{example.id}: a {language or 'plain'} block can only be a file")
            found.append(example)
        pending = None
        i = end + 1
    if pending:
        raise AnnotationError(f"{page}:{pending[0]}: an annotation before no example")
    for previous, example in itertools.pairwise(found):
        if example.continues and previous.not_run:
            raise AnnotationError(f"{example.id}: continues an example that is not run")
    if found and found[0].continues:
        raise AnnotationError(f"{found[0].id}: continues nothing")
    return found


def collect_all(root: Path = ROOT) -> list[Example]:
    return [example for path in pages(root) for example in collect(path, root)]


def chain_of(examples: list[Example], example: Example) -> list[Example]:
    """The examples of ``example``'s chain up to and including it: it and
    the ones it continues."""
    same = [e for e in examples if e.page == example.page]
    start = same.index(example)
    while same[start].continues:
        start -= 1
    return same[start:same.index(example) + 1]


def chain_end(examples: list[Example], example: Example) -> bool:
    """True when no example continues ``example``."""
    same = [e for e in examples if e.page == example.page]
    at = same.index(example)
    return at + 1 == len(same) or not same[at + 1].continues


def console_commands(code: str) -> tuple[str, list[str]]:
    """A console block's commands, as one script, and its output lines."""
    commands: list[str] = []
    output: list[str] = []
    continued = False
    for line in code.splitlines():
        if continued:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            output.append(line)
            continue
        continued = line.endswith("\\")
    return "\n".join(commands) + "\n", output


def shell_lines(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments
    and blank lines left out."""
    joined: list[str] = []
    current = ""
    for line in code.splitlines():
        current += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        if current.strip() and not current.strip().startswith("#"):
            joined.append(current.strip())
        current = ""
    return joined


def output_matches(expected: list[str], actual: str) -> str | None:
    """None when the ``expected`` lines appear in order among the lines of
    ``actual`` (spaces collapsed, ``...`` skipped); else the first line
    missing."""
    have = [" ".join(line.split()) for line in actual.splitlines()]
    at = 0
    for want in (" ".join(line.split()) for line in expected):
        if not want or want == "...":
            continue
        while at < len(have) and have[at] != want:
            at += 1
        if at == len(have):
            return want
        at += 1
    return None
