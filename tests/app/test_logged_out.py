"""Logged out, nothing answers but the login page, what it loads, the login itself and ``/healthz``
(``app.web.gate``): plain HTTP against the team's app (login on), and Chromium for the page."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.app.conftest import PASSWORDS

pytestmark = pytest.mark.integration  # a running app

# what answered a visitor who was not logged in (the first six with 200), and more of Gradio's routes
CLOSED = [
    "openapi.json",
    "gradio_api/heartbeat/x",
    "gradio_api/app_id",
    "gradio_api/token",
    "gradio_api/user",
    "gradio_api/startup-events",
    "docs",
    "redoc",
    "config",
    "gradio_api/info",
    "gradio_api/queue/status",
    "gradio_api/file=/etc/passwd",
    "monitoring",
    "jobs/1/files/config.json",
    "jobs/1/checkpoint.tar",
    "no/such/page",
]


def _get(client: httpx.Client, path: str) -> httpx.Response:
    """The answer's status and its first bytes (a heartbeat is an endless stream)."""
    with client.stream("GET", path, timeout=30) as answer:
        answer.read() if answer.status_code != 200 else next(answer.iter_bytes(), b"")
        return answer


def test_logged_out_only_the_login_page_answers(team):
    url = team["url"]
    with httpx.Client(base_url=url) as visitor:
        for path in CLOSED:
            answer = _get(visitor, path)
            assert answer.status_code == 401, (path, answer.status_code)
            assert answer.json() == {
                "detail": "log in first: this server answers nothing else to a visitor who is not logged in"
            }
        for method, path in [("POST", "gradio_api/call/list_jobs"), ("POST", "gradio_api/queue/join")]:
            assert visitor.request(method, path, json={"data": []}).status_code == 401, path
        page = visitor.get("")
        assert page.status_code == 200 and '"auth_required": true' in page.text.replace('":true', '": true')
        assets = re.findall(r'(?:src|href)="\./(assets/[^"]+)"', page.text)
        assert assets, page.text[:2000]
        for path in [
            *assets,
            "theme.css",
            "favicon.ico",
            "manifest.json",
            "static/js/iframeResizer.contentWindow.min.js",
        ]:
            assert visitor.get(path).status_code == 200, path
        assert visitor.get("healthz").json() == {"database": "ok", "broker": "ok", "store": "ok"}
    with httpx.Client(base_url=url) as member:  # logged in, the same routes answer as before
        assert member.post("login", data={"username": "bob", "password": PASSWORDS["bob"]}).status_code == 200
        for path in ("openapi.json", "gradio_api/app_id", "config", "gradio_api/info"):
            assert member.get(path).status_code == 200, path
        assert _get(member, "gradio_api/heartbeat/x").status_code == 200


@pytest.mark.browser
def test_the_login_page_renders_and_logging_in_works(team, tmp_path):
    """In Chromium: the login page loads with nothing refused, and the app opens after the login."""
    from playwright.sync_api import sync_playwright

    from tests.app.test_browser import ARGS, CHROMIUM

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = chromium.new_page()
        page.set_default_timeout(60_000)
        answers: list[tuple[str, int]] = []
        page.on("response", lambda r: answers.append((r.url, r.status)))
        page.goto(team["url"])
        page.get_by_label("username").fill("carol")
        page.get_by_label("password").fill(PASSWORDS["carol"])
        assert not [a for a in answers if a[1] >= 400], answers  # the page took nothing it was refused
        page.screenshot(path=str(tmp_path / "login.png"))
        page.get_by_role("button", name="Login").click()
        page.get_by_role("tab", name="New run").wait_for()
        page.locator("#signed-in").get_by_text("Signed in as carol").wait_for()
        assert not [a for a in answers if a[1] >= 400], answers
        chromium.close()
