"""The dashboard's pages and forms.

Each page reads what it shows in one function run on a worker thread (the
store layer is synchronous), then renders a template; each form is checked
for its CSRF token before anything is read from it, acts, and redirects
(303) to a page that shows a message once.  Every value from the database
reaches the HTML through Jinja2's autoescape.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from pgfence import names
from pgfence.admin import commands as admin_commands
from pgfence.admin import periodic as periodic_admin
from pgfence.errors import PgfenceError
from pgfence.job import dedupe_idempotency_key, idempotency_key
from pgfence.store import admin as admin_store
from pgfence.store import operations
from pgfence.store import web as store
from pgfence.web import actions, auth
from pgfence.web.dashboard import Dashboard, pretty_json
from pgfence.web.present import (
    HELD_BACK,
    OVERVIEW_EXACT_ROWS,
    PAGE,
    RECENT_SECONDS,
    STATUSES,
    age,
    attempt_lines,
    filter_fields,
    parse_filter,
    parse_id,
    when,
)


T = TypeVar("T")


# -- the pages -------------------------------------------------------------------------


class Views:
    """The routes of one dashboard."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.templates = dashboard.templates
        self.templates.filters["when"] = when
        self.templates.filters["age"] = age
        self.templates.globals["qs"] = lambda values: urlencode(values)
        self._css = (importlib.resources.files("pgfence.web") / "static" / "pgfence.css").read_bytes()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.overview, name="overview"),
            Route("/jobs", self.jobs, name="jobs"),
            Route("/jobs/selected", self.selected, methods=["POST"], name="selected"),
            Route("/jobs/{id:int}", self.job, name="job"),
            Route("/jobs/{id:int}/{action}", self.job_action, methods=["POST"], name="job_action"),
            Route("/queues/pause", self.pause, methods=["POST"], name="pause"),
            Route("/queues/resume", self.resume, methods=["POST"], name="resume"),
            Route("/schedules", self.schedules, name="schedules"),
            Route("/login", self.login, methods=["GET", "POST"], name="login"),
            Route("/logout", self.logout, methods=["POST"], name="logout"),
            Route("/static/pgfence.css", self.css, name="css"),
        ]

    def exception_handlers(self) -> dict[Any, Any]:
        return {HTTPException: self._http_error, PgfenceError: self._database_error}

    # -- plumbing ------------------------------------------------------------------

    async def read(self, load: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``load(conn)`` on a connection of the pool, on a worker thread."""
        def run() -> T:
            with self.dashboard.connection() as conn:
                return load(conn)

        return await run_in_threadpool(run)

    @staticmethod
    def base(request: Request) -> str:
        root: str = request.scope.get("root_path", "")
        return root.rstrip("/")

    def render(self, request: Request, template: str, *, status: int = 200, has_schedules: bool = False,
               **context: Any) -> Response:
        """The page, with the CSRF nonce cookie set on a first visit and the
        message of the last action shown once."""
        signer = self.dashboard.signer
        nonce = request.cookies.get(auth.CSRF_COOKIE)
        fresh = not nonce
        if not nonce:
            nonce = signer.new_nonce()
        flash = signer.flash_message(request.cookies.get(auth.FLASH_COOKIE))
        html = self.templates.get_template(template).render(
            base=self.base(request), csrf_token=signer.csrf_token(nonce), read_only=self.dashboard.read_only,
            flash=flash, has_schedules=has_schedules, password=self.dashboard.password is not None, **context)
        response = HTMLResponse(html, status_code=status)
        path = self.base(request) or "/"
        if fresh:
            response.set_cookie(auth.CSRF_COOKIE, nonce, path=path, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        if auth.FLASH_COOKIE in request.cookies:
            response.delete_cookie(auth.FLASH_COOKIE, path=path)
        return response

    def redirect(self, request: Request, to: str, message: str | None = None) -> Response:
        """303 to ``to`` (a path inside the dashboard), with ``message``
        shown once there."""
        response = RedirectResponse(self.base(request) + to, status_code=303)
        if message is not None:
            response.set_cookie(auth.FLASH_COOKIE, self.dashboard.signer.flash_cookie(message),
                                path=self.base(request) or "/", httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response

    async def form(self, request: Request) -> FormData:
        """The posted form, once its CSRF token matched the visitor's
        cookie; else 403."""
        form = await request.form()
        if not self.dashboard.signer.csrf_valid(request.cookies.get(auth.CSRF_COOKIE), form.get("csrf_token")):
            raise HTTPException(403, "invalid or missing CSRF token: reload the page and try again")
        return form

    def _refuse_read_only(self) -> None:
        if self.dashboard.read_only:
            raise HTTPException(403, "the dashboard is read-only: no action is allowed")

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.render(request, "error.html", status=exc.status_code, message=exc.detail)

    async def _database_error(self, request: Request, exc: Exception) -> Response:
        # The message was translated from the driver's error: no DSN
        # password in it (pgfence.store.db.translate).
        return self.render(request, "error.html", status=503, message=str(exc))

    async def css(self, request: Request) -> Response:
        return Response(self._css, media_type="text/css", headers={"cache-control": "max-age=3600"})

    # -- overview ------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            # As `pgfence status` counts, but sampling history from a fifth
            # of its rows up: the overview is read again and again.
            percent = admin_commands.history_sample_percent(admin_store.history_estimate(conn), OVERVIEW_EXACT_ROWS)
            counts: dict[str, dict[str, int]] = {}
            for count in admin_store.status_counts(conn, percent=percent):
                counts.setdefault(count.queue, {})[count.status] = count.jobs
            oldest = {g.queue: g.oldest_age for g in admin_store.queue_gauges(conn) if g.status == "queued"}
            recent = {r.queue: r for r in store.recent(conn, RECENT_SECONDS)}
            paused = {p.queue: p for p in operations.pauses(conn)}
            queues = sorted(set(counts) | set(paused) | set(recent))
            rows = [{"queue": queue, "counts": counts.get(queue, {}), "oldest": oldest.get(queue),
                     "done": recent[queue].done if queue in recent else 0,
                     "failed": recent[queue].failed if queue in recent else 0,
                     "paused": paused.get(queue)} for queue in queues]
            return {"rows": rows, "estimated": percent < 100.0, "supervisors": operations.supervisors_up(conn),
                    "has_schedules": store.has_schedules(conn)}

        data = await self.read(load)
        return self.render(request, "overview.html", statuses=STATUSES, recent_minutes=int(RECENT_SECONDS // 60),
                           **data)

    async def _pause_form(self, request: Request) -> str:
        form = await self.form(request)
        queue = form.get("queue")
        problem = names.problem(queue, "queue")
        if problem is not None:
            raise HTTPException(400, problem)
        assert isinstance(queue, str)
        return queue

    async def pause(self, request: Request) -> Response:
        queue = await self._pause_form(request)
        changed = await self.read(lambda conn: operations.pause(conn, queue, by="pgfence web"))
        message = f"paused queue {queue}" if changed is not None else f"queue {queue} was paused already"
        return self.redirect(request, "/", message)

    async def resume(self, request: Request) -> Response:
        queue = await self._pause_form(request)
        changed = await self.read(lambda conn: operations.resume(conn, queue))
        message = f"resumed queue {queue}" if changed is not None else f"queue {queue} was not paused"
        return self.redirect(request, "/", message)

    # -- the job list --------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        where, problems = parse_filter(request.query_params)
        before = parse_id(request.query_params.get("before"))

        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            rows = store.jobs_page(conn, where, before=before, limit=PAGE + 1)
            return {"rows": rows, "has_schedules": store.has_schedules(conn)}

        data = await self.read(load)
        rows = data.pop("rows")
        fields = filter_fields(where)
        next_query = urlencode(fields | {"before": str(rows[PAGE - 1].id)}) if len(rows) > PAGE else None
        return self.render(request, "jobs.html", rows=rows[:PAGE], where=where, fields=fields, problems=problems,
                           next_query=next_query, first=before is None, statuses=STATUSES, **data)

    async def selected(self, request: Request) -> Response:
        form = await self.form(request)
        action = str(form.get("action", ""))
        if action not in actions.ELIGIBLE:
            raise HTTPException(400, "unknown action")
        ids = [job_id for job_id in (parse_id(v) for v in form.getlist("ids")) if job_id is not None]
        where, _problems = parse_filter(form)
        back = "/jobs?" + urlencode(filter_fields(where))
        if not ids:
            return self.redirect(request, back, "no job selected")
        outcome = await run_in_threadpool(actions.act_on_ids, self.dashboard.connection, action, ids)
        return self.redirect(request, back, actions.message(action, outcome))

    # -- one job -------------------------------------------------------------------

    async def job(self, request: Request) -> Response:
        job_id: int = request.path_params["id"]

        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            job = store.job(conn, job_id)
            recorded = store.job_attempts(conn, job_id) if job is not None else []
            return {"job": job, "recorded": recorded, "has_schedules": store.has_schedules(conn)}

        data = await self.read(load)
        job: store.JobDetail | None = data.pop("job")
        recorded = data.pop("recorded")
        if job is None:
            return self.render(request, "error.html", status=404, message=f"no job {job_id}", **data)
        redact = self.dashboard.redact_payloads   # a result may hold what the payload did
        payload = "redacted" if redact else pretty_json(job.payload)
        result = None if job.result is None else "redacted" if redact else pretty_json(job.result)
        allowed = [action for action, statuses in actions.ELIGIBLE.items() if job.status in statuses]
        return self.render(
            request, "job.html", job=job, payload=payload, result=result, attempts=attempt_lines(job, recorded),
            allowed=allowed, held_back_text=HELD_BACK.get(job.held_back or "", job.held_back),
            idempotency_key=idempotency_key(job.id),
            dedupe_idempotency_key=dedupe_idempotency_key(job.kind, job.dedupe_key) if job.dedupe_key else None,
            **data)

    async def job_action(self, request: Request) -> Response:
        job_id: int = request.path_params["id"]
        action: str = request.path_params["action"]
        await self.form(request)
        if action not in actions.ELIGIBLE:
            raise HTTPException(404, "unknown action")
        outcome = await run_in_threadpool(actions.act_on_ids, self.dashboard.connection, action, [job_id])
        message = actions.message(action, outcome)
        if action == "delete" and outcome.acted:
            return self.redirect(request, "/jobs", f"deleted job {job_id}")
        return self.redirect(request, f"/jobs/{job_id}", message)

    # -- schedules -----------------------------------------------------------------

    async def schedules(self, request: Request) -> Response:
        entries = await self.read(periodic_admin.listing)
        return self.render(request, "schedules.html", schedules=entries, has_schedules=bool(entries))

    # -- login ---------------------------------------------------------------------

    @staticmethod
    def _next(value: object) -> str:
        """Where the login form sends the visitor: a path inside the
        dashboard only (never another site's address)."""
        # Browsers drop tabs and newlines from a URL ("/\t/evil" would become
        # "//evil", another host) and read a backslash as a slash.
        if (isinstance(value, str) and value.startswith("/") and not value.startswith("//")
                and "\\" not in value and all(ch > " " for ch in value)):
            return value
        return "/"

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", next=self._next(request.query_params.get("next")), error=None)
        form = await self.form(request)
        target = self._next(form.get("next"))
        given = form.get("password")
        password = self.dashboard.password
        if password is None:
            return self.redirect(request, target)
        if not isinstance(given, str) or not auth.password_matches(password, given):
            return self.render(request, "login.html", status=403, next=target, error="wrong password")
        response = self.redirect(request, target)
        response.set_cookie(auth.SESSION_COOKIE, self.dashboard.signer.session_cookie(),
                            max_age=auth.SESSION_SECONDS, path=self.base(request) or "/", httponly=True,
                            samesite="lax", secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        await self.form(request)
        response = self.redirect(request, "/login")
        response.delete_cookie(auth.SESSION_COOKIE, path=self.base(request) or "/")
        return response
