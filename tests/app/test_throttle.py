"""Login throttling (``app.web.throttle``, applied at ``POST /login`` by ``app.web.gate``): the delays
on a fake clock, then one running app with login on whose first wait is 1 s (``LIAR_LOGIN_DELAY``),
over HTTP, through ``liar jobs --server``'s login and in Chromium."""

from __future__ import annotations

import logging
import re
import threading
import time

import httpx
import pytest

from app.web.throttle import FORGET, FREE, Throttle, base_from_env, delay_after, refusal
from tests.app.conftest import PASSWORDS, Launch, stop_app, team_users


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guess(throttle: Throttle, clock: Clock, user: str, address: str, right: bool = False) -> bool | float:
    """One login as the gate makes it: the wait if held back, else whether the password was right."""
    wait = throttle.attempt(user, address)
    if wait > 0:
        return wait
    if right:
        throttle.succeeded(user, address)
    return right


def test_the_first_five_failures_are_free_then_each_wait_doubles():
    assert [delay_after(n, 1.0) for n in range(FREE + 8)] == [0] * FREE + [1, 2, 4, 8, 16, 32, 64, 64]
    assert delay_after(9, 0.0) == 0  # LIAR_LOGIN_DELAY=0: off
    clock = Clock()
    throttle = Throttle(base=1.0, clock=clock)
    for _ in range(FREE):
        assert _guess(throttle, clock, "alice", "10.0.0.1") is False
    assert _guess(throttle, clock, "alice", "10.0.0.1", right=True) == 1.0  # even the right password waits
    clock.now += 0.4
    assert throttle.wait("alice", "10.0.0.1") == pytest.approx(0.6)
    assert refusal(0.6) == "too many failed logins for this account or from this address: try again in 1 s"
    clock.now += 0.6
    assert _guess(throttle, clock, "alice", "10.0.0.1", right=True) is True  # once the delay has passed
    assert throttle.wait("alice", "10.0.0.1") == 0 and throttle.failures("alice", "10.0.0.1") == 0


def test_twenty_wrong_passwords_in_a_row_take_at_least_thirty_seconds():
    """An attacker who tries again the moment the throttle allows: 20 wrong passwords checked take
    at least 30 s of the clock, and the right one still works once the delay has passed."""
    clock = Clock()
    throttle = Throttle(base=1.0, clock=clock)
    start, checked, refused = clock.now, 0, 0
    while checked < 20:
        wait = throttle.attempt("alice", "203.0.113.9")
        if wait > 0:
            refused += 1
            clock.now += wait  # the sentence said when: come back then
        else:
            checked += 1
    assert clock.now - start >= 30 and refused == 20 - FREE
    clock.now += throttle.wait("alice", "203.0.113.9")
    assert _guess(throttle, clock, "alice", "203.0.113.9", right=True) is True


def test_accounts_and_addresses_are_throttled_apart_and_together():
    clock = Clock()
    throttle = Throttle(base=2.0, clock=clock)
    for _ in range(FREE):  # one account from five addresses: the account waits, from anywhere
        throttle.attempt("alice", f"10.0.0.{_}")
    assert throttle.wait("alice", "10.9.9.9") == 2.0 and throttle.wait("bob", "10.9.9.9") == 0
    for name in ("bob", "carol", "dave", "erin", "frank"):  # five accounts from one address: the address waits
        throttle.attempt(name, "198.51.100.7")
    assert throttle.wait("zoe", "198.51.100.7") == 2.0 and throttle.wait("zoe", "198.51.100.8") == 0
    # a name that is no account is throttled as one is: the answers do not tell which names exist
    for _ in range(FREE):
        throttle.attempt("nobody-here", "192.0.2.1")
    assert throttle.wait("nobody-here", "192.0.2.2") == 2.0
    clock.now += FORGET + 1  # failures are forgotten after a quiet while
    assert throttle.wait("alice", "10.9.9.9") == 0 and throttle.failures("alice") == 0


def test_parallel_attempts_cannot_slip_through_one_free_slot():
    """Each attempt is counted when it is let through, before its password is checked: 40 threads at
    once get exactly the five free checks, whatever their passwords' checks then take."""
    throttle = Throttle(base=1.0)
    let_through = []
    barrier = threading.Barrier(40)

    def attempt():
        barrier.wait()
        let_through.append(throttle.attempt("alice", "10.0.0.1") == 0)

    threads = [threading.Thread(target=attempt) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(let_through) == FREE and throttle.failures("alice") == FREE


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_login_delay_is_one_sentence(value):
    with pytest.raises(ValueError, match=r"^LIAR_LOGIN_DELAY is .*: give the first wait in seconds, such as 1$"):
        base_from_env({"LIAR_LOGIN_DELAY": value})
    assert base_from_env({}) == 1.0 and base_from_env({"LIAR_LOGIN_DELAY": "0.25"}) == 0.25


def test_a_bad_login_delay_stops_the_app_before_it_starts(tmp_path):
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "LIAR_DATA_DIR": str(tmp_path), "LIAR_LOGIN_DELAY": "soon"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "app"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("LIAR_LOGIN_DELAY is 'soon': give the first wait in seconds, such as 1")


# --- a running app ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """``liar app`` (no worker) with login on for alice and bob, its first wait 1 s."""
    users = team_users("alice", "bob")
    launch = Launch(
        tmp_path_factory.mktemp("guarded") / "data", "--no-worker", LIAR_APP_USERS=users, LIAR_LOGIN_DELAY="1"
    )
    proc, url = launch.ready()
    yield {"url": url, "log": launch.log}
    stop_app(proc)


def _fail_five_times(url: str, user: str) -> None:
    for _ in range(FREE):
        answer = httpx.post(url + "login", data={"username": user, "password": "not-the-password"}, timeout=60)
        assert answer.status_code == 400 and answer.json()["detail"] == "Incorrect credentials.", answer.text


def _wait_out(answer: httpx.Response) -> None:
    time.sleep(float(answer.headers["Retry-After"]))  # what the refusal asks: not a measurement


@pytest.mark.integration
def test_over_http_the_sixth_attempt_is_refused_until_the_delay_has_passed(guarded):
    url = guarded["url"]
    _fail_five_times(url, "alice")
    held = httpx.post(url + "login", data={"username": "alice", "password": PASSWORDS["alice"]}, timeout=60)
    assert held.status_code == 429 and held.headers["Retry-After"] == "1", held.text
    assert held.json()["detail"] == "too many failed logins for this account or from this address: try again in 1 s"
    _wait_out(held)
    ok = httpx.post(url + "login", data={"username": "alice", "password": PASSWORDS["alice"]}, timeout=60)
    assert ok.status_code == 200 and ok.json() == {"success": True}
    with httpx.Client(base_url=url, cookies=ok.cookies) as browser:  # the login holds
        assert browser.get("config").status_code == 200
    log = guarded["log"].read_text()
    failures = [line for line in log.splitlines() if "failed login for 'alice'" in line]
    assert len(failures) >= FREE and all("from 127.0.0.1" in line for line in failures), log[-2000:]
    assert "not-the-password" not in log and PASSWORDS["alice"] not in log
    assert re.search(r"login refused for 'alice' from 127\.0\.0\.1: throttled", log)


@pytest.mark.integration
def test_the_remote_command_says_when_to_try_again(guarded, monkeypatch):
    """``liar jobs --server``'s login goes through the same throttle, and says its sentence."""
    from app.cli.remote import RemoteError, RemoteJobs

    url = guarded["url"]
    monkeypatch.setenv("LIAR_SERVER_USER", "bob")
    monkeypatch.setenv("LIAR_SERVER_PASSWORD", "not-bobs")
    for _ in range(FREE):
        with pytest.raises(RemoteError, match=r"the login was refused \(wrong account or password\)$"):
            RemoteJobs(url)
    monkeypatch.setenv("LIAR_SERVER_PASSWORD", PASSWORDS["bob"])
    with pytest.raises(RemoteError) as held:
        RemoteJobs(url)
    assert str(held.value) == f"cannot use the server at {url}: {refusal(1)}"
    time.sleep(1.0)  # the wait the sentence named
    assert RemoteJobs(url).list() == []


@pytest.mark.integration
@pytest.mark.browser
def test_the_login_page_shows_when_to_try_again(guarded, tmp_path):
    """A person who mistypes five times reads, on the login page, when to try again, and then logs in."""
    from playwright.sync_api import sync_playwright

    from tests.app.test_browser import ARGS, CHROMIUM

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = chromium.new_page()
        page.set_default_timeout(60_000)
        page.goto(guarded["url"])

        def log_in(password: str) -> None:
            page.get_by_label("username").fill("bob")
            page.get_by_label("password").fill(password)
            with page.expect_response(lambda r: r.url.endswith("/login")):
                page.get_by_role("button", name="Login").click()

        for _ in range(FREE):
            log_in("not-bobs")
        log_in(PASSWORDS["bob"])
        note = page.get_by_role("alert").filter(has_text="too many failed logins")
        note.wait_for()
        assert re.fullmatch(r"too many failed logins for this account or from this address: try again in \d+ s",
                            note.inner_text().strip())  # fmt: skip
        page.screenshot(path=str(tmp_path / "login-throttled.png"))
        time.sleep(1.0)
        log_in(PASSWORDS["bob"])
        page.get_by_role("tab", name="New run").wait_for()
        chromium.close()


def test_failures_go_to_the_log_with_the_address_and_no_password(caplog):
    """The gate's log lines, without a server: a failure names the account and the address."""
    import asyncio

    from app.web.auth import Login
    from app.web.gate import Gate

    login = Login("passwords", {})
    seen = []

    async def gradio(scope, receive, send):  # Gradio's login answering 400, as for a wrong password
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b'{"detail":"Incorrect credentials."}'})

    gate = Gate(gradio, login, Throttle(base=1.0))
    body = b"username=alice&password=hunter2"
    scope = {"type": "http", "method": "POST", "path": "/login", "client": ("192.0.2.44", 5000),
             "headers": [(b"content-type", b"application/x-www-form-urlencoded")]}  # fmt: skip
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    with caplog.at_level(logging.INFO, logger="liar.login"):
        for _ in range(FREE + 1):
            asyncio.run(gate(scope, receive, send))
    assert seen == [body] * FREE  # Gradio saw the form as it was sent; the sixth never reached it
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [400] * FREE + [429]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "failed login for 'alice' from 192.0.2.44 (1 in a row)"
    assert lines[-1].startswith("login refused for 'alice' from 192.0.2.44: throttled for ")
    assert not any("hunter2" in line for line in lines)
