"""Checkpoint downloads: plain HTTP routes served beside the Gradio app, behind its login.

| route                                   | what                                                        |
|-----------------------------------------|-------------------------------------------------------------|
| ``GET jobs/{id}/files/{name}``          | one file of the job's checkpoint (``name`` as in SHA256SUMS; |
|                                         | range requests resume a broken download)                     |
| ``GET jobs/{id}/checkpoint.tar``        | the whole checkpoint as one uncompressed tar, made while it |
|                                         | is sent (``liar-job-N/…``; exact Content-Length)            |

Nothing is compressed or copied first: a 10 GB checkpoint starts downloading at once, and the files
are the ones the worker wrote, with the sizes and sha256 shown on the model page (``sha256sum -c
SHA256SUMS`` inside the folder checks them). Where they come from depends on the store
(``jobs.store``): a file of this host's folder is sent as it is; from a remote store, a file goes to
the user as a signed address of the store (a 307: the bytes do not pass through this app), or, with
``LIAR_STORE_PRESIGN=0`` (users cannot reach the store), streamed through the app, a ``Range`` asked
for honoured there too. The tar always streams through the app. Names are checked and every key is
confined to the job's folder by ``jobs.service.JobService.file``; a job from before per-file
artifacts offers its ``.tar.gz`` under its file name, and its ``checkpoint.tar`` redirects there.

Gradio serves files it returns by copying them into its cache first, which is why checkpoints do not
go through a Gradio component.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse

from app.web.auth import Login
from jobs.access import OPEN, Actor, Forbidden
from jobs.artifacts import Served
from jobs.service import JobService
from jobs.store import Store
from jobs.tombstones import JobDeleted


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
    if isinstance(exc, JobDeleted):  # gone for good, and said by whom: 410, not "not found"
        return HTTPException(410, str(exc))
    return HTTPException(404, str(exc.args[0]) if exc.args else "not found")


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one range ``Range: bytes=a-b`` (or ``a-``, or ``-n``) asks for, as (start, length); None for
    no header or one this does not serve (several ranges: the whole file is sent instead)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].strip().partition("-")
    try:
        if first:
            start, end = int(first), (int(last) if last else size - 1)
        else:
            start, end = max(size - int(last), 0), size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        raise HTTPException(416, f"the file has {size} bytes", headers={"Content-Range": f"bytes */{size}"})
    end = min(end, size - 1)
    return start, end - start + 1


def _streamed(store: Store, f: Served, asked: str | None) -> StreamingResponse:
    """A file of a remote store sent through this app (presigning off), a single range honoured."""
    name = PurePosixPath(f.name).name
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Accept-Ranges": "bytes"}
    span = _byte_range(asked, f.size)
    if span is None:
        headers["Content-Length"] = str(f.size)
        return StreamingResponse(store.chunks(f.key), media_type="application/octet-stream", headers=headers)
    start, length = span
    headers.update({"Content-Length": str(length), "Content-Range": f"bytes {start}-{start + length - 1}/{f.size}"})
    body = store.chunks(f.key, start, length)
    return StreamingResponse(body, status_code=206, media_type="application/octet-stream", headers=headers)


def router(
    service: JobService, dependencies: list[Any] | None = None, actor: Callable[..., Actor] | None = None
) -> APIRouter:
    """The download routes (``dependencies``: e.g. the app's login check; ``actor``: a FastAPI
    dependency naming who asks, for ``LIAR_DOWNLOADS=owners``; everyone may when None)."""
    routes = APIRouter(dependencies=dependencies or [])
    who = Depends(actor or (lambda: OPEN))

    @routes.get("/jobs/{job_id}/files/{name:path}", response_model=None)
    def one_file(job_id: int, name: str, request: Request, user: Actor = who) -> Response:
        try:
            f = service.file(job_id, name, user)
        except (ValueError, PermissionError, KeyError) as exc:
            raise _refused(exc) from None
        filename = PurePosixPath(f.name).name
        here = service.local_path(f)
        if here is not None:
            return FileResponse(here, filename=filename, media_type="application/octet-stream")
        store = service.settings.store()
        signed = store.url(f.key, filename)
        if signed is not None:
            return RedirectResponse(signed, status_code=307)
        return _streamed(store, f, request.headers.get("range"))

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
