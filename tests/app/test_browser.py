"""The web app in a real browser: Debian's Chromium driven headless by Playwright (no browser download).

Two servers (tests.app.conftest): the session's ``app_server`` (no login) for the form, and
``login_server``, with login on, for the whole path — log in, submit, watch the job live, the
dashboard, the model page, download — as two users. Screenshots of every page go to a temporary
folder, or to the folder given by ``--screenshots DIR`` (or ``LIAR_SCREENSHOTS``): ``make screenshots``
refreshes docs/screenshots/ that way. Waits are generous and nothing is timed: the tests share two CPU
cores with everything else.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.app.conftest import PASSWORDS
from tests.jobs.conftest import wait_for

pytestmark = pytest.mark.browser

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
USERS = {user: PASSWORDS[user] for user in ("alice", "bob")}  # login_server's accounts (tests.app.conftest)
LONG = 240  # seconds: the longest wait for a job (three tiny jobs, one worker, paused steps)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is required for the browser tests (.ci/run installs Debian's chromium)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def _new_page(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = context.new_page()
    pg.external_requests = []
    pg.on(
        "request",
        lambda r: (
            None if r.url.startswith(("http://127.0.0.1", "data:", "blob:")) else pg.external_requests.append(r.url)
        ),
    )
    pg.set_default_timeout(60_000)
    pg.goto(url)
    return pg


@pytest.fixture(scope="module")
def page(browser, app_server):
    pg = _new_page(browser, app_server["url"])
    pg.get_by_role("tab", name="New run").wait_for()
    return pg


def _jobs(url: str, auth: tuple[str, str] | None = None) -> list[dict]:
    from gradio_client import Client

    return json.loads(Client(url, auth=auth, verbose=False).predict("", api_name="/list_jobs"))


ADVANCED = ("Samples", "Sequence length", "Seed", "Damping", "Text field", "Label field", "#tasks")


def _open_advanced(page) -> None:
    """Open the New-run tab's Advanced section (closed on a new page) if it is closed."""
    if not page.get_by_label("Samples", exact=True).is_visible():
        page.locator("#advanced > button").first.click()
        page.get_by_label("Samples", exact=True).wait_for()


def _fill(page, label: str, value: str) -> None:
    """Fill the box of a label (or ``#id``: a text box whose name includes its help line)."""
    if label in ADVANCED:
        _open_advanced(page)
    box = (
        page.locator(f"{label} textarea, {label} input").first
        if label.startswith("#")
        else page.get_by_label(label, exact=True)
    )
    box.fill(value)
    box.press("Tab")


def _info(page, label: str) -> str:
    """The help line under a box (by its label, or ``#id``), where its error message shows."""
    if label.startswith("#"):
        return page.locator(f"{label} .info-text").inner_text()
    return (
        page.get_by_label(label, exact=True)
        .locator("xpath=ancestor::*[contains(@class,'block')][1]")
        .locator(".info-text")
        .inner_text()
    )


def _fill_ratio(page, value: str) -> None:
    box = page.locator("#ratio textarea, #ratio input").first
    box.fill(value)
    box.press("Tab")


def _status(page) -> str:
    return page.locator("#submit-status").inner_text()


def _cell(page, table: str, job_id: int, col: int):
    """The cell of a table's row for ``job_id`` (the id in column 0) in column ``col``."""
    row = page.locator(f"#{table} [role=row]").filter(
        has=page.locator("[data-col='0']", has_text=re.compile(rf"^\s*{job_id}\s*$"))
    )
    return row.locator(f"[data-col='{col}']").first


def _table_ids(page, table: str) -> set[int]:
    """The job ids in a table's first column."""
    cells = page.locator(f"#{table} [role=gridcell][data-col='0']").all_inner_texts()
    return {int(t) for t in (c.strip() for c in cells) if t.isdigit()}


# --- the form, without login -----------------------------------------------------------------------


def test_invalid_form_shows_error_and_creates_no_job(page, app_server, screenshots_dir):
    before = len(_jobs(app_server["url"]))
    _fill(page, "Model", str(app_server["data"] / "models" / "no-such-model"))
    page.get_by_role("button", name="Submit", exact=True).click()
    status = page.locator("#submit-status")
    status.get_by_text(re.compile("does not exist")).wait_for()
    page.screenshot(path=str(screenshots_dir / "new-run-error.png"), full_page=True)
    assert "Traceback" not in status.inner_text()
    assert len(_jobs(app_server["url"])) == before


def test_bad_ratios_and_emptied_fields_are_sentences_not_toasts(page, app_server):
    """A ratio out of range is named, not clamped; an emptied box is a sentence in the status line,
    not a raw error toast; nothing is queued either way."""
    data = app_server["data"]
    before = len(_jobs(app_server["url"]))
    _fill(page, "Model", str(data / "models" / "tiny-llama-demo"))
    _fill_ratio(page, "0.2, 1.5")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.locator("#submit-status").get_by_text(re.compile("ratio 1.5 must lie strictly between 0 and 1")).wait_for()
    _fill_ratio(page, "0.2")
    _open_advanced(page)
    for label, message in (("Samples", "samples must be a number"), ("Calibration set", "choose a calibration set")):
        box = page.get_by_label(label, exact=True)
        kept = box.input_value()
        _fill(page, label, "")
        page.get_by_role("button", name="Submit", exact=True).click()
        page.locator("#submit-status").get_by_text(re.compile(message)).wait_for()
        assert page.locator(".toast-body").count() == 0, page.locator(".toast-body").all_inner_texts()
        _fill(page, label, kept)
    assert len(_jobs(app_server["url"])) == before

    recipes = data / "recipes"
    count = len(list(recipes.iterdir())) if recipes.exists() else 0
    for _ in range(2):  # the same recipe validated twice: one file to download
        page.get_by_role("button", name="Validate").click()
        page.locator("#submit-status").get_by_text("✓ valid").wait_for()
        page.locator("#recipe-file a").first.wait_for()
    assert len(list(recipes.iterdir())) <= count + 1


FIRST_SCREEN_JS = """() => {
  const advanced = document.querySelector('#advanced');
  const blocks = new Set();
  for (const el of document.querySelectorAll('input, textarea, select')) {
    const block = el.closest('.block');
    if (!block || block.contains(advanced) || advanced.contains(block)) continue;
    if (!(advanced.compareDocumentPosition(block) & Node.DOCUMENT_POSITION_PRECEDING)) continue;
    if (!block.closest('[role=tabpanel]') || block.getClientRects().length === 0) continue;  // other tabs, hidden
    blocks.add(block);
  }
  return [...blocks].map(b => (b.innerText || b.id).split('\\n')[0].trim());
}"""


def _first_screen_is_the_four_choices_then_advanced(pg, app_server, screenshots_dir, tmp_path):
    """A newcomer's first screen: model, ratio, criterion and calibration set (and its upload, and a
    name without login) — at most 6 inputs before "Advanced", whose title shows its current values."""
    pg.locator("#estimate").get_by_text(
        re.compile("parameters after pruning .* peak ≈ .* on this server's CPU")
    ).wait_for()  # the page's load events have run: what it shows first is on screen
    boxes = pg.evaluate(FIRST_SCREEN_JS)
    assert len(boxes) <= 6, boxes
    for label in ("Model", "Ratio or speed-up", "Criterion", "Calibration set"):
        assert any(b.startswith(label) for b in boxes), (label, boxes)
    title = pg.locator("#advanced > button").first.inner_text()
    assert "prune both" in title and "128 samples × 128 tokens" in title, title
    assert not pg.get_by_label("Samples", exact=True).is_visible()
    pg.screenshot(path=str(screenshots_dir / "new-run-first-screen.png"), full_page=True)
    _fill(pg, "Samples", "64")  # the title follows the values
    pg.locator("#advanced > button").get_by_text(re.compile("64 samples × 128 tokens")).wait_for()


def _a_bad_box_is_named_in_place_until_it_is_fixed(pg, app_server, screenshots_dir, tmp_path):
    """The message goes under the box it is about, not in a fading toast or as a bare "Error" badge,
    and stays there until the box is fixed; a list of ratios names every bad one."""
    before = len(_jobs(app_server["url"]))
    submit = pg.get_by_role("button", name="Submit", exact=True)
    _fill(pg, "Samples", "0")
    submit.click()
    wait_for(lambda: "⚠ samples must be at least 1, got 0" in _info(pg, "Samples"), timeout=60, what="the message")
    pg.get_by_label("Seed", exact=True).click()  # elsewhere: the message stays
    pg.wait_for_timeout(1500)
    assert "⚠ samples must be at least 1" in _info(pg, "Samples")
    assert pg.locator(".toast-body").count() == 0
    _fill(pg, "Samples", "8")  # fixed: the help line is back
    wait_for(lambda: "⚠" not in _info(pg, "Samples"), timeout=60, what="the message to go")
    pg.locator("#submit-status").get_by_text("✓ fixed").wait_for()

    _fill(pg, "Sequence length", "-5")
    submit.click()
    wait_for(lambda: "⚠ sequence length must be at least 2" in _info(pg, "Sequence length"), timeout=60, what="it")
    assert pg.get_by_text("Error", exact=True).count() == 0  # no bare red badges
    _fill(pg, "Sequence length", "32")
    wait_for(lambda: "⚠" not in _info(pg, "Sequence length"), timeout=60, what="the message to go")

    _fill_ratio(pg, "0.2, 1.5, −0.1")
    submit.click()
    message = "ratios 1.5 and -0.1 must each lie strictly between 0 and 1"
    wait_for(lambda: message in _info(pg, "#ratio"), timeout=60, what="both ratios named")
    _fill_ratio(pg, "0.2")

    # what used to validate and fail on the worker after the prune is refused here, under its box
    _fill(pg, "#tasks", "no_such_task")
    submit.click()
    wait_for(lambda: "no_such_task" in _info(pg, "#tasks"), timeout=60, what="the task named")
    _fill(pg, "#tasks", "")
    wait_for(lambda: "⚠" not in _info(pg, "#tasks"), timeout=60, what="the message to go")
    assert len(_jobs(app_server["url"])) == before


def _an_upload_visibly_replaces_the_calibration_set(pg, app_server, screenshots_dir, tmp_path):
    calibration = pg.locator("#calibration input").first
    chosen = calibration.input_value()
    records = tmp_path / "my-records.jsonl"
    records.write_text("".join(json.dumps({"text": f"line {i} of my own text"}) + "\n" for i in range(40)))
    pg.locator("#upload input[type=file]").set_input_files(str(records))
    wait_for(lambda: calibration.input_value() == "⬆ my-records.jsonl", timeout=60, what="the upload to show")
    assert calibration.is_disabled()
    pg.locator("#calibration").get_by_text(re.compile("the uploaded my-records.jsonl replaces it")).wait_for()
    _fill(pg, "Samples", "8")
    _fill(pg, "Sequence length", "16")
    pg.get_by_role("button", name="Validate").click()
    pg.locator("#submit-status").get_by_text("✓ valid").wait_for()
    assert "upload:" in pg.locator(".cm-content").first.inner_text()  # the recipe reads the upload (from the store)
    pg.locator("#upload button[aria-label='Clear']").first.click()  # removed: the set chosen before is back
    wait_for(lambda: calibration.input_value() == chosen, timeout=60, what="the set to come back")
    assert calibration.is_enabled()


def _a_sweep_in_the_recipe_box_submits_all_its_jobs(pg, app_server, screenshots_dir, tmp_path):
    before = len(_jobs(app_server["url"]))
    _fill(pg, "Samples", "4")
    _fill(pg, "Sequence length", "16")
    _fill_ratio(pg, "0.2, 0.3")
    pg.get_by_role("button", name="Validate").click()
    pg.locator("#submit-status").get_by_text("the YAML holds all of them").wait_for()
    assert "grid:" in pg.locator(".cm-content").first.inner_text()  # the recipe box opened, with the grid
    pg.get_by_role("button", name="Submit this YAML").click()
    pg.locator("#submit-status").get_by_text(re.compile(r"submitted sweep \w+ of 2 jobs")).wait_for()
    assert len(_jobs(app_server["url"])) == before + 2


# each a check of its own (a subtest, reported by name), in this order on one fresh page: a page load
# for each cost more than they do; each leaves the form valid for the next, and a failed one reloads it
FRESH_PAGE_CHECKS = (
    _first_screen_is_the_four_choices_then_advanced,
    _a_bad_box_is_named_in_place_until_it_is_fixed,
    _an_upload_visibly_replaces_the_calibration_set,
    _a_sweep_in_the_recipe_box_submits_all_its_jobs,
)


def test_the_new_run_form_on_a_fresh_page(browser, app_server, screenshots_dir, tmp_path, subtests):
    pg = _new_page(browser, app_server["url"])
    pg.get_by_role("tab", name="New run").wait_for()
    for check in FRESH_PAGE_CHECKS:
        with subtests.test(check.__name__.strip("_")):
            try:
                check(pg, app_server, screenshots_dir, tmp_path)
            except BaseException:
                pg.reload()  # the next check starts from the form as a new page shows it
                pg.get_by_role("tab", name="New run").wait_for()
                raise
    pg.context.close()


def test_no_requests_leave_the_machine(page):
    """Works offline: no analytics, no web fonts, nothing fetched from outside (charts included)."""
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
    before = len(_jobs(app_server["url"]))
    box = page.locator("#recipe .cm-content").first  # the editable recipe box
    if not box.is_visible():  # folded away until Validate opens it
        page.locator("#recipe > button").first.click()
    box.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(
        f"model: {data / 'models' / 'tiny-llama-demo'}\nratio: 0.25\n"
        f"calibration: {{dataset: {data / 'texts' / 'tiny-demo.txt'}, num_calibration_samples: 4, "
        "max_seq_length: 16}\n"
    )
    page.get_by_role("button", name="Submit this YAML").click()
    page.locator("#submit-status").get_by_text(re.compile("submitted job")).wait_for()
    assert len(_jobs(app_server["url"])) == before + 1


# --- the whole path, two users, login on -------------------------------------------------------------


def _log_in(browser, url: str, user: str):
    pg = _new_page(browser, url)
    pg.get_by_label("username").fill(user)
    pg.get_by_label("password").fill(USERS[user])
    pg.get_by_role("button", name="Login").click()
    pg.get_by_role("tab", name="New run").wait_for()
    return pg


def _submit(pg, data: Path, ratios: str, methods: tuple[str, ...] = ("liar",)) -> str:
    pg.get_by_role("tab", name="New run").click()
    _fill(pg, "Model", str(data / "models" / "tiny-llama-demo"))
    pg.locator("#model-info").get_by_text(re.compile("decoder · `?llama")).wait_for()
    _fill(pg, "Samples", "8")
    _fill(pg, "Sequence length", "32")
    _fill_ratio(pg, ratios)
    _open_advanced(pg)
    for method in ("liar", "ls"):
        box = pg.get_by_label(method, exact=True)
        box.check() if method in methods else box.uncheck()
    earlier = getattr(pg, "submissions", [])  # this page's earlier answers (each names its own job ids)
    pg.get_by_role("button", name="Submit", exact=True).click()

    def answered() -> str | None:  # a new answer, not an earlier one under Gradio's progress overlay
        lines = _status(pg).strip().splitlines()  # the overlay ("processing | 0.8s", "0.3s") comes first
        return bool(lines) and "submitted" in lines[-1] and lines[-1] not in earlier and lines[-1]

    pg.submissions = [*earlier, wait_for(answered, timeout=60, what="the submission")]
    return pg.submissions[-1]


def _ids(status: str) -> list[int]:
    return [int(i) for i in re.findall(r"\d+", status.rsplit("job", 1)[1])]


def test_two_users_submit_watch_dashboard_download(browser, login_server, tmp_path, screenshots_dir):
    url, data = login_server["url"], login_server["data"]
    alice = _log_in(browser, url, "alice")
    alice.locator("#signed-in").get_by_text("Signed in as alice").wait_for()  # who, and the way out
    assert alice.locator("#signed-in").get_by_role("link", name="Log out").count() == 1
    assert alice.get_by_label("Your name").count() == 0  # the account is known: no name box
    status = _submit(alice, data, "0.2, 0.4")  # a sweep over two ratios
    assert "of 2 jobs (2 ratios)" in status, status
    alice.screenshot(path=str(screenshots_dir / "new-run.png"), full_page=True)
    a1, a2 = _ids(status)

    (a3,) = _ids(_submit(alice, data, "0.5"))  # cancelled below, while it waits

    # watch the first job live: select its row, see it reconstruct layer by layer, then evaluate
    alice.get_by_role("tab", name="Jobs").click()
    cancel, delete = (alice.get_by_role("button", name=n) for n in ("Cancel job", "Delete job"))
    assert cancel.is_disabled() and delete.is_disabled()  # nothing selected yet
    wait_for(lambda: "RUNNING" in _cell(alice, "jobs-table", a1, 1).inner_text(), timeout=LONG, what="job 1 to run")
    _cell(alice, "jobs-table", a1, 1).click()
    wait_for(cancel.is_enabled, timeout=30, what="Cancel to be usable on a running job")
    assert delete.is_disabled()  # a running job is cancelled before it is deleted
    heading, log = alice.locator("#job-heading"), alice.locator("#job-log")
    heading.get_by_text(re.compile(rf"Job {a1}")).wait_for()
    heading.get_by_text(re.compile(r"RUNNING · reconstruct \(layer \d/2\)")).wait_for(timeout=LONG * 1000)
    alice.screenshot(path=str(screenshots_dir / "jobs.png"), full_page=True)
    wait_for(lambda: "layer 1/2:" in log.inner_text(), timeout=LONG, what="the live log to show layer 1")
    assert log.locator(".cm-lineNumbers").count() == 0  # a tail's numbers drifted from its lines
    heading.get_by_text(re.compile(r"RUNNING · evaluate ·")).wait_for(timeout=LONG * 1000)  # a stage of its own
    assert "user" in alice.locator("#jobs-table").inner_text()
    # the third job, cancelled while it waits: labelled a cancellation, not an error
    assert alice.get_by_label("Status", exact=True).input_value() == "all"  # the filter's "all" is named
    _cell(alice, "jobs-table", a3, 1).click()
    alice.locator("#job-heading").get_by_text(re.compile(rf"Job {a3}")).wait_for()
    alice.get_by_role("button", name="Cancel job").click()
    alice.locator("#job-heading").get_by_text(re.compile("Cancelled: cancelled by alice")).wait_for(timeout=60_000)
    assert "Error" not in alice.locator("#job-heading").inner_text()
    _cell(alice, "jobs-table", a1, 1).click()
    heading.get_by_text(re.compile(rf"Job {a1}")).wait_for()
    alice.get_by_role("button", name="Model page ›").click()  # the address names the job it opens
    alice.wait_for_url(re.compile(rf"\?job={a1}$"))
    alice.locator("#model-head").get_by_text(f"Job {a1}").wait_for()

    bob = _log_in(browser, url, "bob")
    (b1,) = _ids(_submit(bob, data, "0.3", ("ls",)))
    auth = ("bob", USERS["bob"])
    wait_for(
        lambda: sum(j["status"] == "SUCCEEDED" for j in _jobs(url, auth)) == 3,
        timeout=3 * LONG,
        what="the three jobs to succeed",
    )
    owners = {j["id"]: j["submitted_by"] for j in _jobs(url, auth) if j["id"] != a3}
    assert owners == {a1: "alice", a2: "alice", b1: "bob"}
    bob.get_by_role("tab", name="Jobs").click()
    for job_id, owner in owners.items():  # each job shows its owner, in either user's table
        wait_for(lambda j=job_id: "SUCCEEDED" in _cell(bob, "jobs-table", j, 1).inner_text(), what="the table")
        assert _cell(bob, "jobs-table", job_id, 6).inner_text().strip() == owner
    _cell(bob, "jobs-table", a1, 1).click()
    bob.locator("#job-timings").get_by_text("reconstruct").wait_for()
    bob.locator("#job-heading").get_by_text(re.compile("by alice")).wait_for()
    for button in ("Cancel job", "Re-run", "Delete job"):  # not his: shown disabled (the API refuses them too)
        assert bob.get_by_role("button", name=button).is_disabled(), button
    assert {j["id"]: j["status"] for j in _jobs(url, auth) if j["id"] != a3} == dict.fromkeys(
        owners, "SUCCEEDED"
    )  # nothing changed
    bob.screenshot(path=str(screenshots_dir / "jobs-timings.png"), full_page=True)

    # the dashboard: perplexity vs ratio, a line per criterion · method, the dense model as a line
    bob.get_by_role("tab", name="Dashboard").click()
    wait_for(lambda: _table_ids(bob, "runs-table") == set(owners), timeout=60, what="the dashboard rows")
    point = bob.locator(f'#ratio-plot svg path[aria-label*="job: {a1};"]').first
    point.wait_for()
    bob.locator("#ratio-plot").get_by_text("dense model").wait_for()
    for job_id in owners:  # a speed-up is a median with its spread, or said to be noise, never a bare number
        speed = _cell(bob, "runs-table", job_id, 10).inner_text().strip()
        assert re.fullmatch(r"not measurable on this worker|\d+\.\d+× \(\d+\.\d+–\d+\.\d+\)", speed), speed
    bob.locator("#ratio-plot").get_by_text("perplexity (log scale)").wait_for()
    point.hover(force=True)
    tooltip = bob.locator("#vg-tooltip-element")
    wait_for(lambda: "alice" in tooltip.inner_text(), timeout=30, what="the point's tooltip")
    assert str(a1) in tooltip.inner_text()
    bob.screenshot(path=str(screenshots_dir / "dashboard.png"), full_page=True)
    for metric, title in (("params_after", "parameters after pruning"), ("perplexity", "perplexity (log scale)")):
        bob.get_by_label("Metric", exact=True).click()  # the chart follows the metric at once
        bob.get_by_role("option", name=metric, exact=True).click()
        bob.locator("#ratio-plot").get_by_text(title).wait_for()
        bob.locator(f'#ratio-plot svg path[aria-label*="job: {a1};"]').first.wait_for()
    _fill(bob, "User", "bob")  # the chart follows the filters, no Refresh needed
    wait_for(lambda: _table_ids(bob, "runs-table") == {b1}, timeout=60, what="the filter to apply")
    bob.locator(f'#ratio-plot svg path[aria-label*="job: {b1};"]').first.wait_for()
    assert bob.locator(f'#ratio-plot svg path[aria-label*="job: {a1};"]').count() == 0
    _fill(bob, "User", "")
    bob.locator(f'#ratio-plot svg path[aria-label*="job: {a1};"]').first.wait_for()

    # a click on the point opens the job's model page (?job=N)
    bob.locator(f'#ratio-plot svg path[aria-label*="job: {a1};"]').first.click(force=True)
    bob.wait_for_url(re.compile(rf"\?job={a1}$"))
    bob.get_by_text(f"Job {a1} — SUCCEEDED").wait_for()
    head = bob.locator("#model-head")
    assert "by alice" in head.inner_text()
    assert len(re.findall(r"^parameters, pruned\t", bob.locator("body").inner_text(), re.M)) == 1  # metrics shown once
    bob.locator("#error-plot svg.marks").first.wait_for()
    bob.locator("#error-plot").get_by_text("0 attn").first.wait_for()  # layers named on the axis
    downloads = bob.locator("#model-downloads")
    downloads.get_by_role("link", name="SHA256SUMS", exact=True).wait_for()
    assert "AutoTokenizer.from_pretrained" in bob.locator("#model-load").inner_text()
    bob.wait_for_timeout(1000)  # let the chart settle before the screenshot
    bob.screenshot(path=str(screenshots_dir / "model.png"), full_page=True)
    with bob.expect_download() as dl:  # one file, as listed with its sha256
        downloads.get_by_role("link", name="config.json", exact=True).click()
    config = tmp_path / "config.json"
    dl.value.save_as(config)
    assert hashlib.sha256(config.read_bytes()).hexdigest() in downloads.inner_text()
    with bob.expect_download() as dl:  # the whole checkpoint as one (streamed, uncompressed) tar
        downloads.get_by_role("link", name=re.compile("Whole checkpoint")).click()
    assert dl.value.suggested_filename == f"liar-job-{a1}.tar"
    archive = tmp_path / "ckpt.tar"
    dl.value.save_as(archive)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    from core import load_pruned

    model, tok = load_pruned(tmp_path / "x" / f"liar-job-{a1}")
    assert tok is not None and sum(p.numel() for p in model.parameters()) > 0
    # the operator's view: the app's own worker answers, listed with its queue
    bob.get_by_role("tab", name="Workers").click()
    wait_for(lambda: bob.locator("#workers-table [role=gridcell]").count() > 0, timeout=60, what="a worker row")
    assert "liar" in bob.locator("#workers-table").inner_text()
    assert alice.external_requests == [] and bob.external_requests == []
