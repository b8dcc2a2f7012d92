"""The Dashboard, the Jobs tab and the recipe viewer in Chromium, on a server of seeded jobs.

One app for the module (login on for alice and bob, neither an administrator, no worker: the jobs are
rows written as a worker would), one browser (``tests.app.test_browser``'s). Screenshots go to the
session's screenshot folder (``--screenshots DIR``) as ``ui-*.png``.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml

from jobs.db import Job, Metric, Status
from tests.app.conftest import PASSWORDS, Launch, stop_app, team_users
from tests.app.test_browser import _cell, _new_page, _table_ids, browser  # noqa: F401  (a fixture)
from tests.jobs.conftest import wait_for

pytestmark = pytest.mark.browser

WINDOWS = {128: ("alice", 15.0), 256: ("bob", 11.0)}  # window length → (owner, dense perplexity)


def _recipe(ratio: float | None, method: str = "liar", **over) -> dict:
    recipe = {
        "model": "models/tiny-llama-demo",
        "ratio": ratio,
        "reconstruction": {"method": method},
        "criterion": {"name": "magnitude"},
    }
    return {**recipe, **over}


def _long_recipe() -> dict:
    """A recipe whose YAML runs past 40 lines."""
    extra = {f"option_{i}": {"value": i, "note": f"line {i}"} for i in range(14)}
    return _recipe(0.3, calibration={"dataset": "texts/tiny-demo.txt", "max_seq_length": 32}, extra=extra)


def _seed(service) -> dict[str, int]:
    """Succeeded runs on 128- and 256-token windows (no speed-up measurable), a speed-target job and a
    running one of alice's, a job with a long recipe; their ids by name."""
    ids: dict[str, int] = {}
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    far = now + dt.timedelta(days=1)  # its heartbeat: never reaped
    with service.sessions.begin() as s:

        def add(name, recipe, user, status=Status.SUCCEEDED, metrics=(), evaluations=(), **row):
            job = Job(recipe=recipe, evaluations=list(evaluations), status=status.value, submitted_by=user, **row)
            s.add(job)
            s.flush()
            s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in dict(metrics).items())
            ids[name] = job.id

        for seq_len, (user, dense) in WINDOWS.items():
            ev = [{"type": "perplexity", "dataset": "texts/tiny-demo.txt", "seq_len": seq_len}]
            for ratio in (0.2, 0.4):
                metrics = {"perplexity": dense * (1 + 2 * ratio), "perplexity_dense": dense, "achieved_ratio": ratio}
                metrics |= {"params_before": 1000.0, "params_after": 1000.0 * (1 - ratio), "block_speedup": 1.01}
                add(f"w{seq_len}-{ratio}", _recipe(ratio), user, metrics=metrics, evaluations=ev)
        target = {"speedup": 1.5, "workload": "decode_b1"}
        add("target", _recipe(None, target=target), "alice", metrics={"achieved_ratio": 0.3})
        add("long", _long_recipe(), "alice", metrics={"achieved_ratio": 0.3})
        add("running", _recipe(0.5), "alice", Status.RUNNING, stage="reconstruct", heartbeat_at=far, started_at=now)
    return ids


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """The module's app (its own: the seeded rows would change other modules' counts) and the jobs."""
    from jobs.service import JobService
    from jobs.settings import Settings

    data = tmp_path_factory.mktemp("ui") / "data"
    launch = Launch(data, "--no-worker", LIAR_APP_USERS=team_users("alice", "bob", admin=None))
    proc, url = launch.ready()
    service = JobService(
        Settings(data_dir=data, database_url=f"sqlite:///{data / 'liar.db'}", broker_url="filesystem://")
    )
    try:
        yield {"url": url, "service": service, "ids": _seed(service)}
    finally:
        stop_app(proc)


def _log_in(browser, url: str, user: str):  # noqa: F811
    pg = _new_page(browser, url)
    pg.get_by_label("username").fill(user)
    pg.get_by_label("password").fill(PASSWORDS[user])
    pg.get_by_role("button", name="Login").click()
    pg.get_by_role("tab", name="New run").wait_for()
    return pg


@pytest.fixture(scope="module")
def bob(browser, ui):  # noqa: F811
    pg = _log_in(browser, ui["url"], "bob")
    yield pg
    pg.context.close()


# --- item 9: the Dashboard ---------------------------------------------------------------------------


def test_dashboard_charts_are_titled_and_say_why_one_is_empty(bob, ui, screenshots_dir):
    bob.get_by_role("tab", name="Dashboard").click()
    ids = ui["ids"]
    runs = {ids[f"w{w}-{r}"] for w in WINDOWS for r in (0.2, 0.4)} | {ids["target"], ids["long"]}
    wait_for(lambda: _table_ids(bob, "runs-table") == runs, timeout=60, what="the dashboard rows")
    speed = bob.locator("#speed-plot")
    speed.get_by_text("perplexity vs realised speed-up").first.wait_for()  # titled, though it has no point
    speed.get_by_text(re.compile("No run's speed-up is measurable")).first.wait_for()  # and says why, in place
    for plot in ("#ratio-plot", "#size-plot"):
        bob.locator(f"{plot} svg.marks").first.wait_for()
    bob.wait_for_timeout(800)
    bob.screenshot(path=str(screenshots_dir / "ui-dashboard.png"), full_page=True)


def test_dashboard_table_names_its_columns_and_shows_the_user_column(bob, ui):
    bob.get_by_role("tab", name="Dashboard").click()
    table = bob.locator("#runs-table")
    table.locator("[role=gridcell]").first.wait_for()
    headers = [h.strip() for h in table.locator("thead th, [role=columnheader]").all_inner_texts() if h.strip()]
    for raw in ("tasks_acc", "params_after", "speedup"):
        assert not any(raw in h for h in headers), headers
    assert any("task accuracy" in h for h in headers) and any("parameters" in h for h in headers), headers
    # every column, the last (user) included, within the table's width at 1400 px: nothing cut off
    assert _fits(bob, "runs-table", "user")


def _fits(pg, table: str, column: str) -> bool:
    """Whether a table's column, its header's text whole, lies within the table's visible width."""
    return pg.locator(f"#{table}").evaluate(
        """(t, name) => {
            const th = t.querySelector(`th[title="${name}"]`), text = th.querySelector('.header');
            const box = t.getBoundingClientRect(), cell = th.getBoundingClientRect();
            return cell.right <= box.right + 1 && text.scrollWidth <= text.clientWidth + 1
                && text.getBoundingClientRect().right <= cell.right + 1;
        }""",
        column,
    )


def test_runs_on_other_windows_are_separate_series_with_their_own_dense_line(bob, ui, screenshots_dir):
    bob.get_by_role("tab", name="Dashboard").click()
    plot = bob.locator("#ratio-plot")
    plot.locator("svg.marks").first.wait_for()
    for seq_len in WINDOWS:  # the legend and the dense lines name the window length
        plot.get_by_text(re.compile(rf"{seq_len}-token windows")).first.wait_for()
    labels = plot.locator("svg text").evaluate_all("ts => ts.map(t => t.textContent)")
    dense = [t for t in labels if t.startswith("dense")]
    assert len(dense) == 2 and all("token windows" in t for t in dense), labels
    bob.locator("#ratio-plot").screenshot(path=str(screenshots_dir / "ui-dashboard-windows.png"))


# --- item 10: the Jobs tab ----------------------------------------------------------------------------


def _pick(pg, job_id: int) -> None:
    pg.get_by_role("tab", name="Jobs").click()
    wait_for(lambda: job_id in _table_ids(pg, "jobs-table"), timeout=60, what=f"job {job_id} in the table")
    _cell(pg, "jobs-table", job_id, 1).click()
    pg.locator("#job-heading").get_by_text(re.compile(rf"Job {job_id}\b")).wait_for()


def test_a_non_owner_sees_cancel_rerun_and_delete_disabled(bob, ui, screenshots_dir):
    buttons = [bob.get_by_role("button", name=n, exact=True) for n in ("Cancel job", "Re-run", "Delete job")]
    for job in ("running", "w128-0.2"):  # alice's, running and finished
        _pick(bob, ui["ids"][job])
        bob.wait_for_timeout(1500)  # past a refresh of the panel
        assert [b.is_disabled() for b in buttons] == [True, True, True], job
    _pick(bob, ui["ids"]["w256-0.2"])  # his own finished job: Re-run and Delete are his to use
    wait_for(lambda: buttons[2].is_enabled() and buttons[1].is_enabled(), timeout=30, what="his own buttons")
    assert buttons[0].is_disabled()
    # a disabled button looks disabled: not the active, coloured look of a usable one
    look = "b => [getComputedStyle(b).opacity, getComputedStyle(b).cursor, getComputedStyle(b).backgroundColor]"
    cancel = buttons[0].evaluate(look)
    assert float(cancel[0]) <= 0.6 and cancel[1] == "not-allowed", cancel
    r, g, b = (int(x) for x in re.findall(r"\d+", cancel[2])[:3])
    assert max(r, g, b) - min(r, g, b) < 40, cancel  # grey, not a pink
    bob.screenshot(path=str(screenshots_dir / "ui-jobs-not-owner.png"), full_page=True)


def test_a_speed_target_does_not_widen_the_ratio_column(bob, ui, screenshots_dir):
    bob.get_by_role("tab", name="Jobs").click()
    _cell(bob, "jobs-table", ui["ids"]["target"], 0).wait_for()
    assert "speed-up 1.5×" in _cell(bob, "jobs-table", ui["ids"]["target"], 8).inner_text()
    try:
        for width in (1400, 1100):  # a laptop's window too
            bob.set_viewport_size({"width": width, "height": 1000})
            bob.wait_for_timeout(1000)
            for column in ("ratio", "method", "criterion"):  # the header reads "criterion", not "criteri"
                assert _fits(bob, "jobs-table", column), (width, column)
        bob.locator("#jobs-table").screenshot(path=str(screenshots_dir / "ui-jobs-table.png"))
    finally:
        bob.set_viewport_size({"width": 1400, "height": 1000})


def test_the_cancel_message_goes_once_the_job_is_cancelled(browser, ui, screenshots_dir):  # noqa: F811
    alice = _log_in(browser, ui["url"], "alice")
    job_id = ui["ids"]["running"]
    _pick(alice, job_id)
    cancel = alice.get_by_role("button", name="Cancel job", exact=True)
    wait_for(cancel.is_enabled, timeout=30, what="Cancel on her running job")
    cancel.click()
    message = alice.locator("#job-message")
    message.get_by_text(re.compile("cancel requested")).wait_for()
    with ui["service"].sessions.begin() as s:  # the worker stops at its next layer
        job = s.get(Job, job_id)
        job.status, job.error = Status.CANCELLED.value, "cancelled by alice"
    alice.locator("#job-heading").get_by_text(re.compile("CANCELLED")).first.wait_for()
    wait_for(lambda: "cancel requested" not in message.inner_text(), timeout=30, what="the message to go")
    alice.screenshot(path=str(screenshots_dir / "ui-jobs-cancelled.png"), full_page=True)
    alice.context.close()


# --- item 12: the recipe viewer ------------------------------------------------------------------------


def test_the_recipe_viewer_numbers_every_line(bob, ui, screenshots_dir):
    """Every line of a long recipe is on the page with its number, without scrolling to it first (the
    code editor drew only the lines near the screen: a screenshot or a print stopped at line 36)."""
    job_id = ui["ids"]["long"]
    bob.goto(f"{ui['url']}?job={job_id}")
    bob.locator("#model-head").get_by_text(f"Job {job_id}").wait_for()
    yaml_lines = yaml.safe_dump(_long_recipe(), sort_keys=False).rstrip("\n").split("\n")
    assert len(yaml_lines) > 40
    viewer = bob.locator("#model-recipe, .cm-editor:has-text('option_0')").first
    viewer.get_by_text("option_0").first.wait_for()
    bob.wait_for_timeout(1000)
    numbers = viewer.locator(".recipe-ln, .cm-lineNumbers .cm-gutterElement").evaluate_all(
        "es => es.map(e => e.textContent.trim()).filter(t => /^[0-9]+$/.test(t))"
    )
    numbers = [int(n) for n in numbers if n != "99"]  # CodeMirror's gutter holds a hidden "99" to size itself
    assert numbers == list(range(1, len(yaml_lines) + 1)), numbers
    assert yaml_lines[-1].strip() in viewer.inner_text()
    bob.screenshot(path=str(screenshots_dir / "ui-recipe.png"), full_page=True)
