"""Checkpoint downloads: plain HTTP routes served beside the Gradio app, behind its login.

| route                                   | what                                                        |
|-----------------------------------------|-------------------------------------------------------------|
| ``GET jobs/{id}/files/{name}``          | one file of the job's checkpoint (``name`` as in SHA256SUMS; |
|                                         | range requests resume a broken download)                     |
| ``GET jobs/{id}/checkpoint.tar``        | the whole checkpoint as one uncompressed tar, made while it |
|                                         | is sent (``liar-job-N/…``; exact Content-Length)            |

Nothing is compressed or copied first: a 10 GB checkpoint starts downloading at once, and the files
are the ones the worker wrote, with the sizes and sha256 shown on the model page (``sha256sum -c
SHA256SUMS`` inside the folder checks them). Names are checked and every path is confined to the job's
folder by ``jobs.service.JobService.file``; a job from before per-file artifacts offers its
``.tar.gz`` under its file name, and its ``checkpoint.tar`` redirects there.

Gradio serves files it returns by copying them into its cache first, which is why checkpoints do not
go through a Gradio component.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse

from app.web.auth import Login
from jobs.access import OPEN, Actor, Forbidden
from jobs.service import JobService


def file_url(job_id: int, name: str) -> str:
    """A file's download address, relative to the app's (so it works behind a proxy's sub-path)."""
    return f"jobs/{int(job_id)}/files/{quote(name)}"


def tar_url(job_id: int) -> str:
    return f"jobs/{int(job_id)}/checkpoint.tar"


def _refused(exc: Exception) -> HTTPException:
    if isinstance(exc, ValueError):
        return HTTPException(400, str(exc))
    if isinstance(exc, Forbidden):
        return HTTPException(403, str(exc))
    if isinstance(exc, PermissionError):
        return HTTPException(403, "that file is outside the job's folder")
    return HTTPException(404, str(exc.args[0]) if exc.args else "not found")


def router(
    service: JobService, dependencies: list[Any] | None = None, actor: Callable[..., Actor] | None = None
) -> APIRouter:
    """The download routes (``dependencies``: e.g. the app's login check; ``actor``: a FastAPI
    dependency naming who asks, for ``LIAR_DOWNLOADS=owners``; everyone may when None)."""
    routes = APIRouter(dependencies=dependencies or [])
    who = Depends(actor or (lambda: OPEN))

    @routes.get("/jobs/{job_id}/files/{name:path}")
    def one_file(job_id: int, name: str, user: Actor = who) -> FileResponse:
        try:
            f = service.file(job_id, name, user)
        except (ValueError, PermissionError, KeyError) as exc:
            raise _refused(exc) from None
        return FileResponse(f.path, filename=PurePosixPath(f.name).name, media_type="application/octet-stream")

    @routes.get("/jobs/{job_id}/checkpoint.tar", response_model=None)
    def whole_checkpoint(job_id: int, user: Actor = who) -> StreamingResponse | RedirectResponse:
        try:
            stream = service.checkpoint_tar(job_id, user)
        except PermissionError as exc:
            raise _refused(exc) from None
        except KeyError as exc:
            try:
                archive = next((f for f in service.served(job_id, user) if f.kind == "archive"), None)
            except KeyError as missing:
                raise _refused(missing) from None
            if archive is None:
                raise _refused(exc) from None
            return RedirectResponse(f"files/{quote(archive.name)}", status_code=307)  # an older job's .tar.gz
        headers = {
            "Content-Length": str(len(stream)),
            "Content-Disposition": f'attachment; filename="liar-job-{job_id}.tar"',
        }
        return StreamingResponse(iter(stream), media_type="application/x-tar", headers=headers)

    return routes


def gradio_login_check(app: FastAPI) -> list[Any] | None:
    """The dependencies Gradio puts on its own pages (its ``/config`` route): a 401 unless logged in,
    when login is on. None if this Gradio has no such route."""
    for route in app.routes:
        if getattr(route, "path", None) == "/config" and getattr(route, "dependencies", None):
            return list(route.dependencies)
    return None


def gradio_current_user(check: list[Any] | None) -> Callable[..., Any] | None:
    """Gradio's own "who is this request from" (the login cookie's account, or the proxy's user): the
    dependency its login check (:func:`gradio_login_check`) takes its user from; None if not found."""
    for depends in check or []:
        function = getattr(depends, "dependency", None)
        if function is None:
            continue
        for parameter in inspect.signature(function).parameters.values():
            inner = getattr(parameter.default, "dependency", None)
            if inner is not None:
                return inner
    return None


def attach(app: FastAPI, service: JobService, login: Login) -> None:
    """Add the download routes to a started Gradio app, ahead of its own, behind its login check;
    refuses (``RuntimeError``) when login is on and this Gradio's check, or its current user, cannot
    be found."""
    check = gradio_login_check(app)
    current = gradio_current_user(check)
    if login.required and (check is None or current is None):
        raise RuntimeError("cannot find Gradio's login check: the download routes would be open to anyone")
    actor = None
    if login.required:

        async def actor(user: str | None = Depends(current)) -> Actor:  # noqa: B008 - FastAPI's idiom
            return login.named(user)

    before = len(app.router.routes)
    app.include_router(router(service, check, actor))
    added = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = added
