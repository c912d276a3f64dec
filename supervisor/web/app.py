"""The dashboard as an ASGI application.

:func:`create_app` returns a Starlette app that ``pgfence web`` serves with
uvicorn, and that any ASGI application can mount under a path of its own
(FastAPI: ``app.mount("/pgfence", create_app(dsn))``).  It reads and writes
the database only through the store layer, on a small pool of its own,
opened at the first request (a mounted app gets no lifespan events of its
own) and closed by :meth:`Dashboard.close`; the runner of its bulk actions
(:mod:`pgfence.web.bulk`) starts and stops with it.
"""

from __future__ import annotations

from urllib.parse import urlencode
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import cookie_parser
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgfence.web import auth
from pgfence.web.bulk import BATCH, LEASE, REST
from pgfence.web.bulk_pages import BulkPages
from pgfence.web.dashboard import Dashboard
from pgfence.web.limits_pages import LimitPages
from pgfence.web.views import Views


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
               secret: bytes | None = None, bulk_batch: int = BATCH, bulk_lease: float = LEASE,
               bulk_rest: float = REST) -> Starlette:
    """The dashboard over the pgfence schema of ``dsn``.

    ``password``: required on every page (HTTP Basic or the login form);
    None leaves the dashboard open, for a loopback address or behind an
    application that authenticates on its own.  ``read_only``: no action is
    shown, every POST is refused.  ``redact_payloads``: no payload is shown.
    ``secret``: the key of the CSRF tokens and session cookies (random per
    process if None); give the same bytes to every process that serves the
    dashboard behind one address.  ``bulk_batch``: jobs per transaction of
    a bulk action; ``bulk_lease``: seconds before another runner may take
    over an action whose runner stopped renewing it; ``bulk_rest``: after
    each batch its runner rests this many times as long as the batch took
    (0: batch after batch).
    """
    dashboard = Dashboard(dsn, read_only=read_only, redact_payloads=redact_payloads, password=password,
                          secret=secret, bulk_batch=bulk_batch, bulk_lease=bulk_lease, bulk_rest=bulk_rest)
    views = Views(dashboard)
    bulk_pages = BulkPages(views)
    limit_pages = LimitPages(views)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # Served on its own, the app starts its runner of bulk actions at
        # startup and closes it and its pool at shutdown; mounted in another
        # app, it gets no lifespan events: the first request starts them,
        # close() is the owner's.
        dashboard.start()
        yield
        dashboard.close()

    app = Starlette(routes=[*bulk_pages.routes(), *limit_pages.routes(), *views.routes()],
                    middleware=[Middleware(Guard, dashboard=dashboard)],
                    exception_handlers=views.exception_handlers(), lifespan=lifespan)
    app.state.dashboard = dashboard
    return app
