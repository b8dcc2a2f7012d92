"""The web app in a real browser: Debian's Chromium driven headless by Playwright (no browser download).

Screenshots of every page are written to docs/screenshots/.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.jobs.conftest import wait_for

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="module")
def page(app_server):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is required for the browser tests (.ci/run installs Debian's chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg = context.new_page()
        pg.external_requests = []
        pg.on(
            "request",
            lambda r: (
                None if r.url.startswith(("http://127.0.0.1", "data:", "blob:")) else pg.external_requests.append(r.url)
            ),
        )
        pg.set_default_timeout(30_000)
        pg.goto(app_server["url"])
        pg.get_by_role("tab", name="New run").wait_for()
        yield pg
        browser.close()


def _jobs(app_server) -> list[dict]:
    from gradio_client import Client

    return json.loads(Client(app_server["url"], verbose=False).predict("", api_name="/list_jobs"))


def _fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Tab")


def test_invalid_form_shows_error_and_creates_no_job(page, app_server):
    before = len(_jobs(app_server))
    _fill(page, "Model", str(app_server["data"] / "models" / "no-such-model"))
    page.get_by_role("button", name="Submit", exact=True).click()
    status = page.locator("#submit-status")
    status.get_by_text(re.compile("does not exist")).wait_for()
    page.screenshot(path=str(SHOTS / "new-run-error.png"), full_page=True)
    assert "Traceback" not in status.inner_text()
    assert len(_jobs(app_server)) == before


def test_submit_watch_dashboard_download(page, app_server, tmp_path):
    data = app_server["data"]
    _fill(page, "Model", str(data / "models" / "tiny-llama-demo"))
    _fill(page, "Samples", "8")
    _fill(page, "Sequence length", "32")
    page.get_by_label("ls", exact=True).check()  # liar + ls: a two-job sweep
    width = page.get_by_label("FFN width multiple", exact=True)
    width.click()
    page.get_by_role("option", name="8", exact=True).click()
    page.locator("#model-info").get_by_text(re.compile("decoder · llama")).wait_for()
    page.get_by_role("button", name="Validate").click()
    page.locator("#submit-status").get_by_text("valid").wait_for()
    page.locator("#recipe-file a").first.wait_for()  # the recipe offered as a download
    assert "neurons: 8" in page.locator(".cm-content").first.inner_text()  # the form's rounding, in the YAML
    page.get_by_role("button", name="Submit", exact=True).click()
    page.locator("#submit-status").get_by_text(re.compile("submitted sweep")).wait_for()
    page.screenshot(path=str(SHOTS / "new-run.png"), full_page=True)
    ids = sorted(j["id"] for j in _jobs(app_server))[-2:]

    page.get_by_role("tab", name="Jobs").click()
    table = page.locator("#jobs-table")
    wait_for(lambda: table.inner_text().count("SUCCEEDED") >= 2, timeout=240, what="the jobs table to show success")
    page.screenshot(path=str(SHOTS / "jobs.png"), full_page=True)

    page.get_by_role("tab", name="Dashboard").click()
    page.get_by_role("button", name="Refresh").click()
    runs = page.locator("#runs-table")
    wait_for(lambda: all(str(i) in runs.inner_text() for i in ids), timeout=60, what="the dashboard rows")
    page.locator("#ppl-plot").wait_for()
    page.wait_for_timeout(1500)  # let the plot render before the screenshot
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)

    page.get_by_role("tab", name="Model").click()
    box = page.locator("#model-job-id input")
    box.fill(str(ids[0]))
    box.press("Tab")
    page.get_by_text(f"Job {ids[0]} — SUCCEEDED").wait_for()
    page.locator("#error-plot").wait_for()
    page.wait_for_timeout(1500)
    downloads = page.locator("#model-downloads")
    downloads.get_by_role("link", name="SHA256SUMS", exact=True).wait_for()
    page.screenshot(path=str(SHOTS / "model.png"), full_page=True)
    with page.expect_download() as dl:  # one file, as listed with its sha256
        downloads.get_by_role("link", name="config.json", exact=True).click()
    config = tmp_path / "config.json"
    dl.value.save_as(config)
    assert hashlib.sha256(config.read_bytes()).hexdigest() in downloads.inner_text()
    with page.expect_download() as dl:  # the whole checkpoint as one (streamed, uncompressed) tar
        downloads.get_by_role("link", name=re.compile("Whole checkpoint")).click()
    assert dl.value.suggested_filename == f"liar-job-{ids[0]}.tar"
    archive = tmp_path / "ckpt.tar"
    dl.value.save_as(archive)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    from core import load_pruned

    model, tok = load_pruned(tmp_path / "x" / f"liar-job-{ids[0]}")
    assert tok is not None and sum(p.numel() for p in model.parameters()) > 0
    assert "Where the time went" in page.locator("body").inner_text()

    page.get_by_role("tab", name="Jobs").click()  # the picked job's stage timings
    pick = page.get_by_label("Job id", exact=True).first
    pick.fill(str(ids[0]))
    pick.press("Tab")
    page.locator("#job-timings").get_by_text("reconstruct").wait_for()
    page.screenshot(path=str(SHOTS / "jobs-timings.png"), full_page=True)


def test_no_requests_leave_the_machine(page):
    """Works offline: no analytics, no web fonts, nothing fetched from outside."""
    for tab in ("Jobs", "Dashboard", "Model", "New run"):
        page.get_by_role("tab", name=tab).click()
    page.wait_for_timeout(500)
    assert page.external_requests == []


def test_encoder_is_detected_and_pasted_recipe_submits(page, app_server):
    data = app_server["data"]
    page.get_by_role("tab", name="New run").click()
    _fill(page, "Model", str(data / "models" / "tiny-bert"))
    page.locator("#model-info").get_by_text(re.compile("encoder · bert.*perplexity does not apply")).wait_for()
    _fill(page, "Model", str(data / "models" / "tiny-llama-demo"))
    page.locator("#model-info").get_by_text(re.compile("decoder")).wait_for()
    before = len(_jobs(app_server))
    box = page.locator(".cm-content").first  # the editable recipe box
    box.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(
        f"model: {data / 'models' / 'tiny-llama-demo'}\nratio: 0.25\n"
        f"calibration: {{dataset: {data / 'texts' / 'tiny-demo.txt'}, num_calibration_samples: 4, "
        "max_seq_length: 16}\n"
    )
    page.get_by_role("button", name="Submit this YAML").click()
    page.locator("#submit-status").get_by_text(re.compile("submitted job")).wait_for()
    assert len(_jobs(app_server)) == before + 1
