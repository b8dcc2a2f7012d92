"""The Jobs tab's Delete asks in the page first, naming what goes; a deleted job's link then says who
deleted it and when (Chromium, the session's ``team`` server: no worker, alice an admin, bob, carol)."""

from __future__ import annotations

import re

import pytest

from jobs.artifacts import job_dir
from jobs.db import Artifact
from tests.app.conftest import PASSWORDS
from tests.app.test_access import _finished
from tests.app.test_browser import _cell, _new_page, _table_ids, browser  # noqa: F401  (the browser fixture)
from tests.jobs.conftest import wait_for

pytestmark = pytest.mark.browser


def _signed_in(browser, url: str, user: str):  # noqa: F811
    pg = _new_page(browser, url)
    pg.get_by_label("username").fill(user)
    pg.get_by_label("password").fill(PASSWORDS[user])
    pg.get_by_role("button", name="Login").click()
    pg.get_by_role("tab", name="New run").wait_for()
    return pg


def _with_export(service, job_id: int) -> str:
    """A GGUF file in the job's checkpoint, recorded as a recipe's export writes it; its name."""
    folder = job_dir(service.settings.artifacts_dir, job_id) / "attempt-1" / "checkpoint"
    gguf = folder / "tiny-Q8_0.gguf"
    gguf.write_bytes(b"\0" * 2_500_000)
    with service.sessions.begin() as s:
        s.add(Artifact(job_id=job_id, kind="file", name=gguf.name, path=str(gguf), size=2_500_000, sha256="0" * 64))
    return gguf.name


def test_delete_asks_first_then_the_link_names_who_deleted_it(browser, team):  # noqa: F811
    service, url = team["service"], team["url"]
    done = _finished(service, team["model"], "carol")
    export = _with_export(service, done)
    folder = job_dir(service.settings.artifacts_dir, done)
    carol = _signed_in(browser, url, "carol")
    carol.get_by_role("tab", name="Jobs").click()
    _cell(carol, "jobs-table", done, 1).click()
    carol.locator("#job-heading").get_by_text(re.compile(rf"Job {done}")).wait_for()
    delete = carol.get_by_role("button", name="Delete job", exact=True)
    wait_for(delete.is_enabled, timeout=30, what="Delete on a finished job")

    delete.click()  # asks, naming the checkpoint, its size and its exports; nothing is removed yet
    question = carol.locator("#delete-question-text")
    question.get_by_text(f"Delete job {done}?").wait_for()
    text = question.inner_text()
    assert re.search(r"its checkpoint \(\d+ files, [\d.]+ [kMG]?B\)", text), text
    assert f"{export} (2.5 MB)" in text, text
    assert folder.is_dir() and service.show(done)["status"] == "SUCCEEDED"
    carol.get_by_role("button", name="Keep it").click()
    question.wait_for(state="hidden")
    assert folder.is_dir() and service.show(done)["status"] == "SUCCEEDED"

    delete.click()
    carol.get_by_role("button", name=f"Delete job {done} and its files").click()
    carol.locator("#job-message").get_by_text(f"deleted job {done}: removed its checkpoint").wait_for()
    carol.locator("#job-heading").get_by_text("Select a job").wait_for()  # no longer picked
    assert "no job" not in carol.locator("body").inner_text()  # never "⚠ no job 9" beside "deleted job 9"
    assert not folder.exists()
    wait_for(lambda: done not in _table_ids(carol, "jobs-table"), timeout=30, what="the row to go")

    # a link to it, shared before, names the deletion (not another run, not "no job")
    bob = _signed_in(browser, url, "bob")
    bob.goto(f"{url}?job={done}")
    bob.locator("#model-head").get_by_text(re.compile(rf"job {done} was deleted by carol on \d{{4}}-")).wait_for()
    for pg in (carol, bob):
        pg.context.close()
