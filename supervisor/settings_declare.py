"""A setting's declaration: :func:`setting` declares a field of
:class:`pgfence.settings.Settings`, and :class:`Declaration` is what the
parser, the loaders and the docs' settings table read of it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pgfence import bounds
from pgfence.settings_values import Converter, boolean, duration, name_list, optional_duration, whole

#: The commands that run workers; most settings belong to both.
WORKER_COMMANDS = ("work", "run")


@dataclass(frozen=True)
class Declaration:
    """One setting as declared: everything that the parser, the loaders and
    the docs' table need to know about it.

    ``name`` is the field name (``poll_interval``); ``flag`` and ``env``
    follow from it.  ``shown`` is the default as the help and the docs
    show it.  ``doc`` is the docs' text, ``help`` the shorter ``--help``
    one.  ``commands`` take the setting as a flag; a ``hidden`` setting is
    set by code only (no flag, no environment variable, no TOML key).
    ``option`` names the flag when the setting's name would not do (the
    ``web_`` settings are ``pgfence web --host``, not ``--web-host``).
    """

    name: str
    convert: Converter
    default: Any
    help: str
    doc: str
    shown: str
    commands: tuple[str, ...]
    hidden: bool
    option: str | None = None

    @property
    def flag(self) -> str:
        return self.option or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "PGFENCE_" + self.name.upper()

    @property
    def label(self) -> str:
        """The name used in error lines (``invalid poll-interval: ...``)."""
        return self.name.replace("_", "-")

    @property
    def is_boolean(self) -> bool:
        return self.convert is boolean

    @property
    def metavar(self) -> str:
        """The value's placeholder in ``--help``."""
        base: Converter = getattr(self.convert, "__wrapped__", self.convert)
        placeholders: dict[Converter, str] = {duration: "DURATION", whole: "N", name_list: "NAMES"}
        return placeholders.get(base, "TEXT")

    @property
    def range(self) -> str | None:
        """The documented range of a duration (pgfence.bounds), if it has one."""
        return bounds.describe(self.name) if self.name in bounds.RANGES else None


_META = "pgfence.setting"


def setting(default: Any, convert: Converter, help: str, *, doc: str | None = None, shown: str | None = None,
            commands: tuple[str, ...] = WORKER_COMMANDS, hidden: bool = False, option: str | None = None) -> Any:
    """Declare a :class:`Settings` field: its default and how it is read.

    The return value is a dataclass field; the field's name completes the
    declaration (:func:`declare`, :data:`pgfence.settings.DECLARATIONS`).
    """
    meta = {"convert": convert, "help": help, "doc": doc or help, "shown": shown, "commands": commands,
            "hidden": hidden, "option": option}
    return field(default=default, metadata={_META: meta})


def _shown(convert: Converter, default: Any) -> str:
    """The default as the help and the docs write it."""
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    if isinstance(default, float) and convert in (duration, optional_duration):
        return bounds.human(default)
    return str(default)


def declare(f: dataclasses.Field[Any]) -> Declaration:
    meta = f.metadata[_META]
    return Declaration(name=f.name, convert=meta["convert"], default=f.default, help=meta["help"],
                       doc=meta["doc"], shown=meta["shown"] or _shown(meta["convert"], f.default),
                       commands=meta["commands"], hidden=meta["hidden"], option=meta["option"])
