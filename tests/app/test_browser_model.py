"""The Model page in Chromium: the prompt box shows the pruned checkpoint's and the dense model's text
with each one's tokens/s, and the serving-forms panel offers only the forms the checkpoint can take
(the tiny model's WordLevel tokenizer has no GGUF form: said, not offered), queues an export and lists
its files with their sha256.

On the team's server (login on, no worker of its own): the job is pruned in-process on its database,
routed to a queue that a worker started here serves (``test_generate_api.queue_worker``). Screenshots
go where ``test_browser``'s do (``--screenshots DIR``)."""

from __future__ import annotations

import re

import pytest

from jobs.tasks import execute
from tests.app.conftest import PASSWORDS
from tests.app.test_browser import LONG, _new_page, browser  # noqa: F401  (the module's Chromium)
from tests.app.test_generate_api import queue_worker, route_to
from tests.jobs.conftest import wait_for

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def pruned_job(team, llama_dir, corpus):
    """A job of bob's pruned in-process on the team's database (every layer keeps as many query heads:
    vLLM's form is possible), routed to the queue the worker started here serves."""
    service = team["service"]
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    recipe = {"model": str(llama_dir), "ratio": 0.3, "query_heads": "uniform", "calibration": calibration}
    job_id = service.submit(recipe, "bob")
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    route_to(service, job_id)
    with queue_worker(team["data"]):
        yield job_id


def _log_in(browser, url: str, user: str, job_id: int):  # noqa: F811
    pg = _new_page(browser, f"{url}?job={job_id}")
    pg.get_by_label("username").fill(user)
    pg.get_by_label("password").fill(PASSWORDS[user])
    pg.get_by_role("button", name="Login").click()
    pg.get_by_role("tab", name="New run").wait_for()
    return pg


def test_the_prompt_box_and_the_serving_forms(browser, team, pruned_job, screenshots_dir):  # noqa: F811
    url, service = team["url"], team["service"]
    bob = _log_in(browser, url, "bob", pruned_job)
    if "job=" not in bob.url:  # the login page may drop the address's query
        bob.goto(f"{url}?job={pruned_job}")
    bob.locator("#model-head").get_by_text(f"Job {pruned_job} — SUCCEEDED").wait_for()

    # only the possible forms are offered; the impossible ones say why
    panel = bob.locator("#model-exports")
    panel.get_by_text("Serving forms").wait_for()
    text = panel.inner_text()  # every GGUF type refused for the one reason: one row, said once
    assert re.search(r"GGUF f16, q8_0, q5_k_m, q4_k_m, q3_k_m, iq3_xxs, iq2_m \(llama.cpp\)\s+gguf-f16 ", text)
    assert text.count("✗ cannot write the tokenizer") == 1
    assert re.search(r"vLLM \(DeciLM form\)\s+vllm\s+possible", panel.inner_text())
    offered = bob.locator("#export-forms label")
    assert [offered.nth(i).inner_text().strip() for i in range(offered.count())] == ["vLLM (DeciLM form)"]

    # the prompt box: both sides' text and tokens/s, from the worker of the job's queue
    bob.locator("#try-prompt textarea").fill("the model keeps")
    tokens = bob.locator("#try-tokens input")
    tokens.fill("8")
    bob.locator("#try-button").click()
    speed = bob.locator("#try-speed")
    wait_for(lambda: "tokens/s" in speed.inner_text(), timeout=LONG, what="the generated text")
    line = speed.inner_text()
    assert re.search(r"pruned: \d+\.\d tokens/s \(\d+ tokens in", line), line
    assert re.search(r"dense: \d+\.\d tokens/s \(\d+ tokens in", line), line
    pruned = bob.locator("#try-pruned textarea").input_value()
    dense = bob.locator("#try-dense textarea").input_value()
    assert pruned.strip() and dense.strip()
    bob.screenshot(path=str(screenshots_dir / "model-try.png"), full_page=True)

    # a bad token count is one sentence in the page, not a traceback
    tokens.fill("0")
    bob.locator("#try-button").click()
    speed.get_by_text("tokens: a whole number from 1 to 256, not 0").wait_for()

    # export the possible form: an export job, then its files with their sha256
    bob.locator("#export-forms label").first.click()
    bob.locator("#export-button").click()
    bob.locator("#export-status").get_by_text(re.compile(r"queued export job \d+")).wait_for()
    export_id = int(re.search(r"export job (\d+)", bob.locator("#export-status").inner_text()).group(1))
    panel.get_by_text(re.compile(rf"Export job {export_id} — vllm · (QUEUED|RUNNING|SUCCEEDED)")).wait_for()
    wait_for(lambda: service.show(export_id)["status"] == "SUCCEEDED", timeout=LONG, what="the export job")
    bob.locator("#export-refresh").click()  # the panel follows the export job when asked
    panel.get_by_text(f"Export job {export_id} — vllm · SUCCEEDED").wait_for()
    sha = next(f["sha256"] for f in service.downloads(export_id) if f["name"] == "vllm/config.json")
    assert sha in panel.inner_text()
    assert bob.locator("#export-forms label").count() == 0  # nothing left to offer
    panel.get_by_role("link", name="vllm/config.json").wait_for()
    bob.screenshot(path=str(screenshots_dir / "model-exports.png"), full_page=True)
    assert bob.external_requests == []
