"""Names, not paths, as a person sees them in Chromium: every tab of the team's server, logged in and
not, shows the server's models and texts as the model list names them (``models/tiny-llama-demo``,
``texts/…``), never the data folder's path, for a job submitted by those names and for one stored
with a path (as jobs were before names, ``jobs.names``)."""

from __future__ import annotations

import re
import shutil

import pytest

from jobs.artifacts import job_dir
from jobs.db import Artifact, Job, Status
from tests.app.conftest import PASSWORDS
from tests.app.test_browser import _new_page, browser  # noqa: F401 - the module's Chromium
from tests.app.test_names import leaks, server_prefixes

pytestmark = pytest.mark.browser


def _succeeded(service, recipe: dict, owner: str) -> int:
    """A job of ``owner`` recorded as finished with the bundled model's files as its checkpoint."""
    job_id = service.submit(recipe, owner)
    checkpoint = job_dir(service.settings.artifacts_dir, job_id) / "attempt-1" / "checkpoint"
    shutil.copytree(service.names.path(recipe["model"]), checkpoint)
    with service.sessions.begin() as s:
        job = s.get(Job, job_id)
        job.status, job.stage, job.recipe = Status.SUCCEEDED.value, "done", recipe  # as given: a path stays
        s.add(Artifact(job_id=job_id, kind="checkpoint", path=str(checkpoint), size=1))
    return job_id


def _tab_html(pg, tab: str, ready: str) -> str:
    pg.get_by_role("tab", name=tab).click()
    pg.locator(ready).first.wait_for()
    pg.wait_for_timeout(1500)  # (not timed: lets the tab's own load events land before the page is read)
    return pg.content()


def test_every_tab_names_the_servers_models_and_texts(browser, team, tmp_path_factory):  # noqa: F811
    data, service = team["data"], team["service"]
    prefixes = server_prefixes(data, tmp_path_factory.getbasetemp())
    model, text = "models/tiny-llama-demo", "texts/tiny-demo.txt"
    named = _succeeded(service, {"model": model, "ratio": 0.3, "calibration": {"dataset": text}}, "alice")
    typed = {"model": str(data / model), "ratio": 0.25, "calibration": {"dataset": str(data / text)}}
    old = _succeeded(service, typed, "alice")  # stored with the paths, as before names
    found = {}
    logged_out = _new_page(browser, team["url"])
    logged_out.get_by_label("username").wait_for()
    if leaked := leaks(logged_out.content(), prefixes):
        found["login page"] = leaked
    pg = _new_page(browser, team["url"])
    pg.get_by_label("username").fill("alice")
    pg.get_by_label("password").fill(PASSWORDS["alice"])
    pg.get_by_role("button", name="Login").click()
    pg.get_by_role("tab", name="New run").wait_for()
    assert pg.get_by_label("Model").first.input_value() == model  # the box's default: the model list's name
    assert pg.get_by_label("Calibration set").first.input_value() == text
    for tab, ready in (("Jobs", "table"), ("Dashboard", ".tabitem:visible"), ("Workers", ".tabitem:visible")):
        if leaked := leaks(_tab_html(pg, tab, ready), prefixes):
            found[tab] = leaked
    for job_id in (named, old):
        pg.goto(f"{team['url']}?job={job_id}")
        pg.locator("#model-head").get_by_text(re.compile(rf"Job {job_id}\b")).wait_for()
        recipe = pg.locator("#model-head, .cm-content").all_inner_texts()
        html = pg.content()
        assert model in html and "tiny-demo.txt" in " ".join(recipe) + html, job_id
        if leaked := leaks(html, prefixes):
            found[f"model page of job {job_id}"] = leaked
    assert not found, found
