"""``GET /healthz``: is this app able to work? For a container healthcheck or a load balancer's probe.

Answers 200 with ``{"database": "ok", "broker": "ok"}`` when the jobs database answers a query and the
broker takes a connection, 503 with ``"down"`` for the one that does not. The body is only those
words: no URL, host, path or error text (those go to the app's log, passwords masked), since the route
is open — a probe has no login, and the page's own login would make every probe fail. Workers are not
part of it: an app with no worker is still up (jobs wait), and ``liar health --workers`` checks them.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from jobs.health import check_broker, check_database, check_store
from jobs.service import JobService

logger = logging.getLogger(__name__)
PATH = "/healthz"


def status(service: JobService) -> tuple[int, dict[str, str]]:
    """The HTTP status and body of ``/healthz`` (a failed check's reason is logged, not returned)."""
    checks = [check_database(service.settings), check_broker(service.celery), check_store(service.settings)]
    for check in checks:
        if not check.ok:
            logger.warning("health: %s", check.line())
    body = {check.name: "ok" if check.ok else "down" for check in checks}
    return (200 if all(c.ok for c in checks) else 503), body


def attach(app: FastAPI, service: JobService) -> None:
    """Add ``GET /healthz`` to a started Gradio app, ahead of its own routes."""
    routes = APIRouter()

    @routes.get(PATH, include_in_schema=False)
    def healthz() -> JSONResponse:  # a plain def: FastAPI runs it in a thread, the checks may wait
        code, body = status(service)
        return JSONResponse(body, status_code=code, headers={"Cache-Control": "no-store"})

    before = len(app.router.routes)
    app.include_router(routes)
    added = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = added
