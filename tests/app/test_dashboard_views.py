"""The dashboard's titled charts and their reasons when empty, its readers' column names, runs on other
perplexity windows kept apart; the Jobs tab's buttons for a non-owner, a stale cancel message; the recipe
viewer's numbered lines (``app.web.charts``, ``app.web.views``; no server)."""

from __future__ import annotations

import json

from app.web import charts, dashboard_charts, views
from jobs.access import Actor
from jobs.db import Job, Metric, Status


def _add(service, user, ratio, metrics, seq_len=None, status=Status.SUCCEEDED, **row) -> int:
    ev = [] if seq_len is None else [{"type": "perplexity", "dataset": "wikitext2", "seq_len": seq_len}]
    recipe = {"model": "/m/llama-7b", "ratio": ratio, "reconstruction": {"method": "liar"}}
    recipe["criterion"] = {"name": "magnitude"}
    with service.sessions.begin() as s:
        job = Job(recipe=recipe, evaluations=ev, status=status.value, submitted_by=user, **row)
        s.add(job)
        s.flush()
        s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in metrics.items())
        return job.id


def _ppl(ppl, dense, **more):
    return {"perplexity": ppl, "perplexity_dense": dense, "achieved_ratio": 0.2, "params_before": 10.0, **more}


def test_every_chart_is_titled_and_an_empty_one_says_why(job_service):
    _add(job_service, "ada", 0.2, _ppl(20.0, 15.0, block_speedup=1.01), seq_len=128)  # a single timing
    rows = charts.run_rows(job_service)
    specs = dashboard_charts.dashboard_charts(rows, "perplexity")
    json.dumps(specs)
    assert [s["title"] if isinstance(s["title"], str) else s["title"]["text"] for s in specs] == [
        "perplexity vs pruning ratio",
        "perplexity vs parameters kept (◆ dense)",
        charts.SPEED_TITLE,
    ]
    speed = specs[2]
    assert speed["mark"]["type"] == "text"  # drawn in the chart's place
    reason = " ".join(speed["data"]["values"][0]["reason"])
    assert reason.startswith("No run's speed-up is measurable on this worker: 1 run was timed once")
    assert "No run among these recorded both a perplexity and its parameter count." in " ".join(
        specs[1]["data"]["values"][0]["reason"]
    )
    assert "mean accuracy" in " ".join(
        dashboard_charts.dashboard_charts(rows, "tasks_acc")[0]["data"]["values"][0]["reason"]
    )
    empty = dashboard_charts.dashboard_charts([], "perplexity")
    assert all(s["data"]["values"][0]["reason"] == [dashboard_charts.NO_RUNS] for s in empty)


def test_the_runs_table_names_its_columns_for_readers():
    headers = charts.table_headers()
    assert len(headers) == len(charts.RUN_COLUMNS) == len(charts.RUN_WIDTHS)
    for raw in ("tasks_acc", "params_after", "speedup", "id"):
        assert raw not in headers
    assert "task accuracy (mean)" in headers and "parameters kept" in headers and headers[-1] == "user"
    assert sum(float(w.rstrip("%")) for w in charts.RUN_WIDTHS) <= 100


def test_runs_on_other_windows_are_other_series_each_with_its_dense_line(job_service):
    for seq_len, dense in ((128, 15.0), (256, 11.0)):
        for ratio in (0.2, 0.4):
            _add(job_service, "ada", ratio, _ppl(dense * (1 + ratio), dense, params_after=8.0), seq_len=seq_len)
    rows = charts.run_rows(job_service)
    assert sorted({r["window"] for r in rows}) == [128, 256]
    spec = charts.metric_vs_ratio(rows, "perplexity")
    series = sorted({p["series"] for p in spec["data"]["values"]})
    assert series == ["magnitude · liar · 128-token windows", "magnitude · liar · 256-token windows"]
    points = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "point")
    assert points["encoding"]["shape"]["field"] == "window"
    rule = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "rule")
    dense = sorted((d["label"], d["value"]) for d in rule["data"]["values"])
    assert dense == [("dense model · 128-token windows", 15.0), ("dense model · 256-token windows", 11.0)]
    size = charts.perplexity_vs_size(rows)  # the dense diamonds say which window each is
    labels = next(layer for layer in size["layer"] if layer["mark"]["type"] == "text")
    assert sorted(d["label"] for d in labels["data"]["values"])[0] == "dense model · 128-token windows"
    one = [r for r in rows if r["window"] == 128]  # one window: named nowhere, as before
    spec = charts.metric_vs_ratio(one, "perplexity")
    assert {p["series"] for p in spec["data"]["values"]} == {"magnitude · liar"}
    assert "shape" not in next(layer for layer in spec["layer"] if layer["mark"]["type"] == "point")["encoding"]


def test_a_non_owner_may_use_none_of_the_jobs_buttons(job_service):
    running = _add(job_service, "alice", 0.5, {}, status=Status.RUNNING)
    done = _add(job_service, "alice", 0.2, {"evaluations_failed": 1.0})
    bob, alice = Actor("bob"), Actor("alice")
    for job in (running, done):
        view = views.job_view(job_service, job, actor=bob)
        assert view.buttons == views.NO_BUTTONS and not view.rerun
    assert views.job_view(job_service, running, actor=alice).buttons == (True, False, False)
    mine = views.job_view(job_service, done, actor=alice)
    assert mine.buttons == (False, True, True) and mine.rerun
    assert not views.job_view(job_service, None, actor=alice).rerun  # nothing picked: nothing to re-run


def test_a_pending_cancels_message_goes_once_the_job_has_finished(job_service):
    job = _add(job_service, "alice", 0.5, {}, status=Status.RUNNING)
    message = views.cancel_job(job_service, job, Actor("alice"))
    assert views.CANCELLING in message
    assert not views.stale_message(message, views.job_view(job_service, job))
    with job_service.sessions.begin() as s:
        s.get(Job, job).status = Status.CANCELLED.value
    assert views.stale_message(message, views.job_view(job_service, job))
    assert not views.stale_message("deleted job 3 and its files", views.job_view(job_service, job))


def test_the_recipe_viewer_numbers_every_line():
    text = "".join(f"key_{i}: <{i}>\n" for i in range(45))
    out = views.numbered_yaml(text)
    assert out.count('class="recipe-ln"') == 45 and ">45</span>" in out
    assert "key_44: &lt;44&gt;" in out  # escaped
    assert views.numbered_yaml("") == ""
