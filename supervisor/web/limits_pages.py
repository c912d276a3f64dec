"""The Limits page: every kind with concurrency or rate limits, the limits
in force and where they come from, the slots held and the jobs held back;
and its forms, which set a kind's limits at run time or reset them to its
handler's declaration (:mod:`pgfence.admin.limits`, as ``pgfence limits
set`` and ``reset`` do, in one transaction that gates the kind's jobs
again).

Bad input (a kind that is no kind name, a limit that is no whole number
from 1 up, a rate that :func:`pgfence.limits.parse_rate` refuses, no limit
at all) is refused before anything is written: the page comes back with one
line saying why (400).  Forms, escaping and the password are the other
pages' (:class:`pgfence.web.views.Views`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from pgfence import limits, names
from pgfence.admin import limits as admin
from pgfence.errors import ConfigError
from pgfence.store import limits as limits_store
from pgfence.store import web as store
from pgfence.web import auth
from pgfence.web.views import Views

#: The form's fields for the two limits, and how its messages name them.
LIMIT_FIELDS = (("concurrency", "concurrency"), ("per_key", "per-key concurrency"))

_DIGITS = re.compile(r"[0-9]{1,12}")


def form_limit(value: object, what: str) -> int | None:
    """A limit typed in the form: None when left empty, else a whole number
    from 1 up; ConfigError otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        return None
    if not _DIGITS.fullmatch(text):
        raise ConfigError(f"invalid {what}: must be a whole number, got {text!r}")
    return limits.check_limit(int(text), what)


def form_rate(value: object) -> str | None:
    """A rate typed in the form (``100/s``, ``10/min``): None when left
    empty, else the text, once :func:`pgfence.limits.parse_rate` takes it;
    ConfigError otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        return None
    limits.parse_rate(text, "rate")
    return text


def parse_set(form: Mapping[str, Any]) -> tuple[str, int | None, int | None, str | None]:
    """(kind, concurrency, per-key concurrency, rate) of the set form;
    ConfigError with one line on bad input."""
    raw = form.get("kind")
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        raise ConfigError("give the kind whose limits to set")
    kind = names.check(text, "kind")
    concurrency, per_key = (form_limit(form.get(field), what) for field, what in LIMIT_FIELDS)
    rate = form_rate(form.get("rate"))
    if concurrency is None and per_key is None and rate is None:
        raise ConfigError("give a concurrency, a per-key concurrency, a rate, or several")
    return kind, concurrency, per_key, rate


def source(row: limits_store.LimitRow) -> str:
    """Where a kind's limits in force come from: ``set`` at run time (which
    wins until reset), its ``handler``'s declaration, or ``none``."""
    if row.set_concurrency is not None or row.set_per_key is not None or row.set_rate is not None:
        return "set"
    if row.declared_concurrency is not None or row.declared_per_key is not None or row.declared_rate is not None:
        return "handler"
    return "none"


def rate_in_force(row: limits_store.LimitRow) -> str | None:
    """The kind's rate in force as it is written (``100/s``); None: none."""
    if row.rate_count is None or row.rate_period is None:
        return None
    return admin.rate_text((row.rate_count, row.rate_period))


def described(concurrency: int | None, per_key: int | None, rate: str | None) -> str:
    """Limits as the flash message and the page write them."""
    return (f"concurrency {'-' if concurrency is None else concurrency}, "
            f"per key {'-' if per_key is None else per_key}, rate {rate or '-'}")


def declared(row: limits_store.LimitRow) -> str:
    """What the kind's handler declares, as the page writes it."""
    return described(row.declared_concurrency, row.declared_per_key, admin.rate_text(row.declared_rate))


class LimitPages:
    """The Limits page and its forms, on the plumbing of ``views``."""

    def __init__(self, views: Views) -> None:
        self.views = views
        self.dashboard = views.dashboard

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/limits", self.listing, name="limits"),
            Route("/limits/set", self.set, methods=["POST"], name="limits_set"),
            Route("/limits/reset", self.reset, methods=["POST"], name="limits_reset"),
        ]

    async def _page(self, request: Request, *, status: int = 200, problem: str | None = None,
                    entered: Mapping[str, str] | None = None) -> Response:
        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            return {"rows": limits_store.list_limits(conn), "has_schedules": store.has_schedules(conn)}

        data = await self.views.read(load)
        return self.views.render(request, "limits.html", status=status, problem=problem, entered=entered or {},
                                 source=source, rate_in_force=rate_in_force, declared=declared, **data)

    async def listing(self, request: Request) -> Response:
        return await self._page(request)

    @staticmethod
    def who(request: Request) -> str:
        """The operator, as the limits row's updated_by records it."""
        return auth.operator(request.scope.get("user"), request.headers.get("authorization"),
                             request.client.host if request.client else None)

    async def set(self, request: Request) -> Response:
        form = await self.views.form(request)
        entered = {name: value for name in ("kind", "concurrency", "per_key", "rate")
                   if isinstance(value := form.get(name), str)}
        try:
            kind, concurrency, per_key, rate = parse_set(form)
        except ConfigError as exc:
            return await self._page(request, status=400, problem=str(exc), entered=entered)
        by = self.who(request)
        row = await self.views.read(lambda conn: admin.set_limits(
            conn, kind, concurrency=concurrency, per_key_concurrency=per_key, rate=rate, by=by))
        return self.views.redirect(request, "/limits", f"set the limits of kind {kind}: "
                                   + described(row["concurrency"], row["per_key_concurrency"], row["rate"]))

    async def reset(self, request: Request) -> Response:
        form = await self.views.form(request)
        raw = form.get("kind")
        kind = raw.strip() if isinstance(raw, str) else ""
        by = self.who(request)
        try:
            if not kind:
                raise ConfigError("give the kind whose limits to reset")
            names.check(kind, "kind")
            row = await self.views.read(lambda conn: admin.reset(conn, kind, by=by))
        except ConfigError as exc:
            return await self._page(request, status=400, problem=str(exc))
        return self.views.redirect(request, "/limits", f"reset the limits of kind {kind} to its handler's: "
                                   + described(row["concurrency"], row["per_key_concurrency"], row["rate"]))
