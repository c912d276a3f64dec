"""The dashboard as an ASGI application.

:func:`create_app` returns a Starlette app that ``pgfence web`` serves with
uvicorn, and that any ASGI application can mount under a path of its own
(FastAPI: ``app.mount("/pgfence", create_app(dsn))``).  It reads and writes
the database only through the store layer, on a small pool of its own,
opened at the first request (a mounted app gets no lifespan events of its
own) and closed by :meth:`Dashboard.close`.
"""

from __future__ import annotations

import json
import threading
from urllib.parse import urlencode
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import jinja2
import psycopg
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import cookie_parser
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgfence.store import db
from pgfence.store import web as store
from pgfence.web import auth

#: Connections of one dashboard: a page reads on one at a time.
POOL_SIZE = 4
#: The longest statement the dashboard runs (a count over a large history).
STATEMENT_MS = 60_000

#: Sent with every response: no script, style, frame or form target but the
#: dashboard's own; no inline script (the templates have none).
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

#: Paths open without a password: the login form and the style sheet.
OPEN_PATHS = ("/login", "/static/pgfence.css")


def route_path(scope: Scope) -> str:
    """The request's path inside the dashboard, without the path it is
    mounted at."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path or "/"


class Dashboard:
    """One dashboard: its options, its signer, its pool and its templates."""

    def __init__(self, dsn: str, *, read_only: bool, redact_payloads: bool, password: str | None,
                 secret: bytes | None) -> None:
        self.dsn = dsn
        self.read_only = read_only
        self.redact_payloads = redact_payloads
        self.password = password or None
        self.signer = auth.Signer(secret)
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("pgfence.web", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)

    @property
    def pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None:
                def configure(conn: psycopg.Connection[Any]) -> None:
                    store.session(conn, STATEMENT_MS)

                pool: ConnectionPool = ConnectionPool(
                    db.conninfo(self.dsn, application_name="pgfence-web"), min_size=0, max_size=POOL_SIZE,
                    open=False, timeout=10.0, configure=configure, name="pgfence-web",
                    # Autocommit: each read is its own snapshot, each action
                    # its own transaction.  Not prepared: the job list's
                    # filters fold away only in a plan made for the values.
                    kwargs={"autocommit": True, "prepare_threshold": None})
                pool.open(wait=False)
                self._pool = pool
            return self._pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, driver errors translated."""
        with db.translated(self.dsn), self.pool.connection() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


class Guard:
    """Every request passes here: the security headers on every response,
    the password when one is set, and no POST in read-only mode (the login
    form's aside).  CSRF tokens are checked where forms are read
    (:meth:`pgfence.web.views.Views.form`)."""

    def __init__(self, app: ASGIApp, dashboard: Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in SECURITY_HEADERS if h[0] not in names)]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> Response | None:
        path = route_path(scope)
        method = scope["method"]
        if self.dashboard.password and path not in OPEN_PATHS and not self._authenticated(scope):
            if method in ("GET", "HEAD"):
                query = scope.get("query_string", b"").decode("latin-1")
                target = path + (f"?{query}" if query else "")
                login = scope.get("root_path", "") + "/login?" + urlencode({"next": target})
                return RedirectResponse(login, status_code=303)
            return PlainTextResponse("authentication required\n", status_code=401)
        if self.dashboard.read_only and method not in ("GET", "HEAD") and path not in ("/login", "/logout"):
            return PlainTextResponse("the dashboard is read-only: no action is allowed\n", status_code=403)
        return None

    def _authenticated(self, scope: Scope) -> bool:
        password = self.dashboard.password
        assert password is not None
        headers = Headers(scope=scope)
        given = auth.basic_password(headers.get("authorization"))
        if given is not None and auth.password_matches(password, given):
            return True
        cookies = cookie_parser(headers.get("cookie", ""))
        return self.dashboard.signer.session_valid(cookies.get(auth.SESSION_COOKIE))


def create_app(dsn: str, *, read_only: bool = False, redact_payloads: bool = False, password: str | None = None,
               secret: bytes | None = None) -> Starlette:
    """The dashboard over the pgfence schema of ``dsn``.

    ``password``: required on every page (HTTP Basic or the login form);
    None leaves the dashboard open, for a loopback address or behind an
    application that authenticates on its own.  ``read_only``: no action is
    shown, every POST is refused.  ``redact_payloads``: no payload is shown.
    ``secret``: the key of the CSRF tokens and session cookies (random per
    process if None); give the same bytes to every process that serves the
    dashboard behind one address.
    """
    from pgfence.web.views import Views

    dashboard = Dashboard(dsn, read_only=read_only, redact_payloads=redact_payloads, password=password,
                          secret=secret)
    views = Views(dashboard)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # Served on its own, the app closes its pool at shutdown; mounted in
        # another app, it gets no lifespan events: close() is the owner's.
        yield
        dashboard.close()

    app = Starlette(routes=views.routes(), middleware=[Middleware(Guard, dashboard=dashboard)],
                    exception_handlers=views.exception_handlers(), lifespan=lifespan)
    app.state.dashboard = dashboard
    return app


def pretty_json(value: Any) -> str:
    """A payload as indented JSON text (escaped later, by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
