"""The app's front door, with login on: an ASGI middleware in front of Gradio's routes
(``launch`` passes it through ``app_kwargs``).

- **Logged out, nothing answers** but the login page (``GET /``), what that page loads
  (:data:`OPEN_PREFIXES`, :data:`OPEN_PATHS`: its scripts, styles, icon and manifest), the login
  itself (``POST /login``) and ``GET /healthz``. Everything else — ``/openapi.json``, Gradio's
  ``/gradio_api/…`` (heartbeat, app id, token, info, queue), ``/config``, the API endpoints, the
  download routes — answers 401 with one sentence. "Logged in" is Gradio's own judgement (its login
  cookie, or the trusted proxy's header: ``app.web.downloads.gradio_current_user``).
- **Every password is checked at ``POST /login``** (Gradio's login form, ``gradio_client`` and so
  ``liar jobs --server``; the API and the download routes take the login's cookie, never a password),
  so the login throttle (``app.web.throttle``) sits here: an attempt the throttle holds back gets
  429 with the sentence that says when to try again (and ``Retry-After``); the page shows it (a few
  lines of script added to the logged-out page: Gradio's login form shows only its own words).
  Each failure goes to the server log with the client's address, never the password.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any
from urllib.parse import parse_qs

from app.web.throttle import Throttle, refusal

logger = logging.getLogger("liar.login")

OPEN_PATHS = {"/", "/healthz", "/theme.css", "/favicon.ico", "/manifest.json", "/robots.txt", "/logout"}
OPEN_PREFIXES = ("/assets/", "/static/")
LOGIN_PATHS = {"/login", "/login/"}
STARTUP = "/gradio_api/startup-events"  # Gradio's launch calls it once, before anyone could log in
LOGGED_OUT = "log in first: this server answers nothing else to a visitor who is not logged in"
# shows a throttled login's sentence on the login page, where Gradio's form would show nothing
SHOW_REFUSAL = b"""<script>(() => {
  const fetched = window.fetch;
  window.fetch = async (...args) => {
    const answer = await fetched(...args);
    const url = new URL(args[0] instanceof Request ? args[0].url : String(args[0]), location.href);
    if (/\\/login\\/?$/.test(url.pathname)) {
      let note = document.getElementById("login-refused");
      if (!note) {
        note = document.createElement("p");
        note.id = "login-refused";
        note.setAttribute("role", "alert");
        note.style.cssText = "color:#b91c1c;font-weight:600;text-align:center;margin:1em";
        document.body.prepend(note);
      }
      note.textContent = answer.status === 429 ? (await answer.clone().json()).detail : "";
    }
    return answer;
  };
})();</script>"""


def _json(status: int, detail: str, headers: dict[str, str] | None = None) -> tuple[dict, dict]:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": "http.response.start", "status": status, "headers": raw}, {
        "type": "http.response.body",
        "body": body,
    }


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that gives ``body`` once, then what the client sends next (a disconnect)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _username(scope, body: bytes) -> str:
    """The ``username`` field of a login form (urlencoded, as gradio_client sends it, or multipart,
    as Gradio's page does), stripped as Gradio strips it."""
    from starlette.requests import Request

    kind = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
    if kind.startswith("application/x-www-form-urlencoded"):
        values = parse_qs(body.decode("utf-8", "replace")).get("username", [""])
        return values[0].strip()
    try:
        form = await Request(scope, _replay(body, _nothing)).form()
    except Exception:  # not a form: Gradio refuses it; counted under an empty name
        return ""
    value = form.get("username")
    return value.strip() if isinstance(value, str) else ""


def _with_script(send):
    """``send`` for an HTML page, with :data:`SHOW_REFUSAL` added before its ``</body>``."""
    held: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            kind = dict(message.get("headers") or []).get(b"content-type", b"")
            if not kind.startswith(b"text/html"):
                return await send(message)
            held["start"] = message
            return None
        if "start" not in held or message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        page = b"".join(chunks)
        at = page.rfind(b"</body>")
        page = page[:at] + SHOW_REFUSAL + page[at:] if at >= 0 else page + SHOW_REFUSAL
        start = held.pop("start")
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
        await send({"type": "http.response.body", "body": page})

    return sending


async def _nothing():
    return {"type": "http.disconnect"}


class Gate:
    """The middleware: ``login`` (``app.web.auth.Login``) says whether login is on and how;
    ``throttle`` holds the failed logins (passwords only)."""

    def __init__(self, app, login, throttle: Throttle | None = None):
        self.app, self.login, self.throttle = app, login, throttle
        self._current = None  # Gradio's "who is this", found on the first request

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.login.required:
            return await self.app(scope, receive, send)
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if scope["type"] == "http" and path in LOGIN_PATHS and scope["method"] == "POST":
            return await self._login(scope, receive, send)
        if path == "/" and self.throttle is not None and scope["type"] == "http" and scope["method"] == "GET":
            if not await self._logged_in(scope):  # the login page
                return await self.app(scope, receive, _with_script(send))
        if path == STARTUP and not getattr(scope["app"], "startup_events_triggered", True):
            return await self.app(scope, receive, send)
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or await self._logged_in(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        start, body = _json(401, LOGGED_OUT)
        await send(start)
        await send(body)

    async def _logged_in(self, scope) -> bool:
        from starlette.requests import HTTPConnection, Request

        if self._current is None:
            from app.web.downloads import gradio_current_user, gradio_login_check

            self._current = gradio_current_user(gradio_login_check(scope["app"]))
            if self._current is None:  # the page's own check is then all there is: refuse the rest
                logger.error("cannot find Gradio's login check: refusing every request but the login page")
                return False
        user = self._current(Request(scope) if scope["type"] == "http" else HTTPConnection(scope))
        if hasattr(user, "__await__"):
            user = await user
        return user is not None

    async def _login(self, scope, receive, send) -> None:
        if self.throttle is None:
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        user = await _username(scope, body)
        address = (scope.get("client") or ("unknown",))[0]
        wait = self.throttle.attempt(user, address)
        if wait > 0:
            logger.warning("login refused for %r from %s: throttled for %.1f s more", user, address, wait)
            start, answer = _json(429, refusal(wait), {"Retry-After": str(math.ceil(wait))})
            await send(start)
            return await send(answer)
        status = {}

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, _replay(body, receive), watch)
        if status.get("code") == 200:
            self.throttle.succeeded(user, address)
            logger.info("login of %r from %s", user, address)
        else:
            failures = self.throttle.failures(user, address)
            logger.warning("failed login for %r from %s (%d in a row)", user, address, failures)
