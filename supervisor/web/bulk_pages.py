"""The pages of bulk actions: the confirmation of "every job matching the
filter", the POST that records the action and answers at once (303 to its
page, whatever the number of jobs), the action's page (its progress, which
refreshes itself while it runs, with or without script, and its Cancel
button) and the list of recent actions, the audit of who did what.

The work itself is :mod:`pgfence.web.bulk`'s runner.  Forms, escaping and
the password are the other pages' (:class:`pgfence.web.views.Views`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from pgfence.store import bulk as bulk_store
from pgfence.store import web as store
from pgfence.web import actions, auth, bulk
from pgfence.web.present import filter_fields, parse_filter, parse_id
from pgfence.web.views import Views

#: Actions the pages list.
RECENT = 20
#: Seconds between two loads of a running action's page.
REFRESH_SECONDS = 2


class BulkPages:
    """The routes of bulk actions, on the plumbing of ``views``."""

    def __init__(self, views: Views) -> None:
        self.views = views
        self.dashboard = views.dashboard

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/jobs/bulk", self.confirm, methods=["GET"], name="bulk_confirm"),
            Route("/jobs/bulk", self.start, methods=["POST"], name="bulk"),
            Route("/operations", self.listing, name="operations"),
            Route("/operations/{id:int}", self.operation, name="operation"),
            Route("/operations/{id:int}/cancel", self.cancel, methods=["POST"], name="operation_cancel"),
        ]

    @staticmethod
    def who(request: Request) -> str:
        """The operator, for the audit (:func:`pgfence.web.auth.operator`)."""
        return auth.operator(request.scope.get("user"), request.headers.get("authorization"),
                             request.client.host if request.client else None)

    async def confirm(self, request: Request) -> Response:
        self.views._refuse_read_only()
        action = request.query_params.get("action", "")
        if action not in actions.ELIGIBLE:
            raise HTTPException(400, "unknown action")
        where, problems = parse_filter(request.query_params)
        if problems:
            raise HTTPException(400, "; ".join(problems))
        eligible = list(actions.ELIGIBLE[action])

        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            count, upto = store.jobs_count(conn, where, eligible)
            return {"count": count, "upto": upto, "has_schedules": store.has_schedules(conn)}

        data = await self.views.read(load)
        return self.views.render(request, "bulk.html", action=action, eligible=eligible, where=where,
                                 fields=filter_fields(where), batch=self.dashboard.bulk_batch, **data)

    async def start(self, request: Request) -> Response:
        form = await self.views.form(request)
        action = str(form.get("action", ""))
        if action not in actions.ELIGIBLE:
            raise HTTPException(400, "unknown action")
        where, problems = parse_filter(form)
        if problems:
            raise HTTPException(400, "; ".join(problems))
        fields = filter_fields(where)
        given = form.get("upto")
        if not isinstance(given, str) or not given.strip():
            return self.views.redirect(request, "/jobs?" + urlencode(fields), "no job matched")
        upto = parse_id(given)
        if upto is None:
            raise HTTPException(400, f"upto: not a job id: {given!r}")
        by, batch = self.who(request), self.dashboard.bulk_batch
        action_id = await self.views.read(
            lambda conn: bulk.begin(conn, action=action, fields=fields, upto=upto, batch=batch, by=by))
        self.dashboard.wake_runner()
        return self.views.redirect(request, f"/operations/{action_id}",
                                   f"operation {action_id} started: {action} every job matching the filter")

    async def listing(self, request: Request) -> Response:
        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            return {"recent": bulk_store.recent(conn, RECENT), "has_schedules": store.has_schedules(conn)}

        data = await self.views.read(load)
        return self.views.render(request, "operations.html", done=actions.DONE, **data)

    async def operation(self, request: Request) -> Response:
        action_id: int = request.path_params["id"]

        def load(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            return {"op": bulk_store.get(conn, action_id), "recent": bulk_store.recent(conn, RECENT),
                    "has_schedules": store.has_schedules(conn)}

        data = await self.views.read(load)
        op: bulk_store.BulkAction | None = data.pop("op")
        if op is None:
            return self.views.render(request, "error.html", status=404, message=f"no operation {action_id}",
                                     has_schedules=data["has_schedules"])
        return self.views.render(request, "operation.html", op=op, done=actions.DONE,
                                 refresh=REFRESH_SECONDS if op.state == "running" else None, **data)

    async def cancel(self, request: Request) -> Response:
        action_id: int = request.path_params["id"]
        await self.views.form(request)
        by = self.who(request)
        cancelled = await self.views.read(lambda conn: bulk_store.cancel(conn, action_id, by=by))
        if cancelled is None:
            message = f"operation {action_id} was not running"
        else:
            message = (f"cancelled operation {action_id}: {cancelled.acted} job(s) "
                       f"{actions.DONE[cancelled.action]} before it stopped")
        return self.views.redirect(request, f"/operations/{action_id}", message)
