"""The dashboard's rows and the Vega-Lite charts (``app.web.charts``), without a server: they read like
the paper's figures (metric vs ratio, a line per criterion · method, the dense model, log perplexity),
every run is a point naming its job and linking to it."""

from __future__ import annotations

import json

import pytest

from app.web import charts
from app.web.figures import NOT_MEASURABLE, SINGLE_TIMING
from jobs.db import Job, Metric, Status


def _row(job, ratio, ppl, criterion="magnitude", method="liar", model="llama-7b", dense=5.68, **over):
    row = {
        "id": job,
        "model": model,
        "criterion": criterion,
        "method": method,
        "ratio": ratio,
        "achieved": ratio - 0.01,
        "perplexity": ppl,
        "dense": dense,
        "params_after": int(6.7e9 * (1 - ratio)),
        "speedup": 1 + ratio,
        "user": "ada",
        "params_before": int(6.7e9),
    }
    row.update(over)
    return row


ROWS = [
    _row(1, 0.2, 6.9),
    _row(2, 0.4, 9.8),
    _row(3, 0.2, 7.4, method="bias"),
    _row(4, 0.3, 12.0, criterion="flap", dense=None),  # a series of one ratio
]


def _layer(spec, mark):
    return next(layer for layer in spec["layer"] if layer["mark"]["type"] == mark)


def test_perplexity_vs_ratio_reads_like_the_papers_figure():
    spec = charts.metric_vs_ratio(ROWS, "perplexity")
    json.dumps(spec)  # plain JSON for gr.Plot
    line, points, rule = _layer(spec, "line"), _layer(spec, "point"), _layer(spec, "rule")
    assert line["encoding"]["y"]["scale"] == {"type": "log"} and points["encoding"]["y"]["scale"] == {"type": "log"}
    assert line["encoding"]["color"]["field"] == "series" and line["encoding"]["x"]["field"] == "ratio"
    values = spec["data"]["values"]
    assert sorted({v["series"] for v in values}) == ["flap · liar", "magnitude · bias", "magnitude · liar"]
    assert [v["job"] for v in values if v["series"] == "flap · liar"] == [4]  # drawn as a point
    assert {v["href"] for v in values} == {"?job=1", "?job=2", "?job=3", "?job=4"}
    assert points["encoding"]["href"] == {"field": "href"}
    assert points["encoding"]["tooltip"][0]["field"] == "job"
    dense = {"model": "llama-7b", "value": 5.68, "params": int(6.7e9), "label": "dense model"}
    assert rule["data"]["values"] == [dense]


def test_other_metrics_are_linear_and_never_empty():
    for metric in ("achieved", "params_after", "speedup"):
        spec = charts.metric_vs_ratio(ROWS, metric)
        assert len(spec["data"]["values"]) == len(ROWS), metric  # params_after used to empty the plot
        assert "type" not in _layer(spec, "point")["encoding"]["y"]["scale"]
        assert not any(layer["mark"]["type"] == "rule" for layer in spec["layer"])  # a dense line: perplexity only
    assert charts.metric_vs_ratio([], "perplexity") is None
    assert charts.metric_vs_ratio([_row(1, 0.2, None)], "perplexity") is None


def test_several_models_get_their_own_lines_and_dense_lines():
    rows = ROWS + [_row(5, 0.2, 8.1, model="llama-13b", dense=5.09)]
    spec = charts.metric_vs_ratio(rows, "perplexity")
    assert "llama-13b · magnitude · liar" in {v["series"] for v in spec["data"]["values"]}
    labels = [d["label"] for d in _layer(spec, "rule")["data"]["values"]]
    assert sorted(labels) == ["dense llama-13b", "dense llama-7b"]


def test_perplexity_vs_size_has_the_dense_model_as_a_point():
    spec = charts.perplexity_vs_size(ROWS)
    dense = [layer for layer in spec["layer"] if layer.get("data")]
    assert dense[0]["data"]["values"][0]["params"] == int(6.7e9) and dense[0]["mark"]["shape"] == "diamond"
    assert charts.perplexity_vs_size([]) is None


def test_perplexity_vs_speed_is_the_trade_off_with_the_dense_model_at_one():
    rows = ROWS + [_row(5, 0.5, 30.0, speedup=None)]  # a run without a speed measurement is left out
    spec = charts.perplexity_vs_speed(rows)
    json.dumps(spec)
    line, points = _layer(spec, "line"), _layer(spec, "point")
    assert points["encoding"]["x"]["field"] == "speedup" and points["encoding"]["y"]["scale"] == {"type": "log"}
    assert line["encoding"]["order"] == {"field": "ratio"} and line["encoding"]["color"]["field"] == "series"
    assert points["encoding"]["href"] == {"field": "href"}
    assert {"speed-up", "measured on"} <= {t.get("title") for t in points["encoding"]["tooltip"]}
    values = spec["data"]["values"]
    assert [v["job"] for v in values] == [1, 2, 3, 4] and values[0]["speedup"] == 1.2
    dense = [layer for layer in spec["layer"] if layer.get("data")][0]
    assert dense["data"]["values"][0]["speedup"] == 1.0 and dense["data"]["values"][0]["value"] == 5.68
    assert dense["mark"]["shape"] == "diamond"
    assert charts.perplexity_vs_speed([_row(1, 0.2, 6.9, speedup=None)]) is None
    assert charts.perplexity_vs_speed([]) is None


def test_layer_errors_name_the_layers():
    report = [
        {"layer": 0, "module": "attention", "kept": 6, "total": 8, "error_before": 0.2, "error_after": 0.1},
        {"layer": 0, "module": "ffn", "kept": 40, "total": 48, "error_before": 0.3, "error_after": 0.2},
        {"layer": 1, "module": "attention", "kept": 6, "total": 8, "error_before": 0.25, "error_after": 0.15},
    ]
    spec = charts.layer_errors(report)
    x = spec["layer"][0]["encoding"]["x"]
    assert x["type"] == "ordinal" and x["sort"] == {"field": "order"}
    assert [v["projection"] for v in spec["data"]["values"][::2]] == ["0 attn", "0 ffn", "1 attn"]
    assert {v["when"] for v in spec["data"]["values"]} == {"pruned", "reconstructed"}
    assert charts.layer_errors([]) is None and charts.layer_errors(None) is None


@pytest.fixture()
def finished_jobs(job_service):
    """Three succeeded jobs and a failed one, stored directly (no worker)."""
    # job 2 timed its blocks once (an older job: no spread); job 3 its blocks and its prefill repeatedly
    spreads = {"block_speedup_low": 1.02, "block_speedup_high": 1.3, "prefill_speedup_low": 1.15}
    spreads |= {"prefill_speedup_high": 1.25, "prefill_speedup_repeats": 5}
    runs = [
        ("ada", 0.2, "liar", {"perplexity": 20.5, "perplexity_dense": 15.0, "achieved_ratio": 0.19}),
        ("bob", 0.4, "liar", {"perplexity": 31.0, "achieved_ratio": 0.39, "params_after": 100.0, "block_speedup": 1.4}),
        ("ada", 0.2, "ls", {"perplexity": 19.0, "achieved_ratio": 0.19, "block_speedup": 1.1, "prefill_speedup": 1.2}),
    ]
    runs[2][3].update(spreads)
    with job_service.sessions.begin() as s:
        for user, ratio, method, metrics in runs:
            recipe = {"model": "/m/llama-7b", "ratio": ratio, "reconstruction": {"method": method}}
            recipe["criterion"] = {"name": "magnitude"}
            job = Job(recipe=recipe, evaluations=[], status=Status.SUCCEEDED.value, submitted_by=user)
            s.add(job)
            s.flush()
            s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in metrics.items())
        s.add(Job(recipe={"model": "/m/llama-7b", "ratio": 0.5}, evaluations=[], status=Status.FAILED.value))
    return job_service


def test_lm_eval_accuracy_is_a_dashboard_metric(finished_jobs):
    """A job that ran lm-eval tasks records each task's metrics and their mean (jobs.tasks): the mean is
    a column of the runs table and a metric to plot against the ratio; runs without it are left out."""
    with finished_jobs.sessions.begin() as s:
        recipe = {
            "model": "/m/llama-7b",
            "ratio": 0.3,
            "reconstruction": {"method": "ls"},
            "criterion": {"name": "obs"},
        }
        job = Job(recipe=recipe, evaluations=[], status=Status.SUCCEEDED.value, submitted_by="cy")
        s.add(job)
        s.flush()
        metrics = {"achieved_ratio": 0.3, "piqa.acc": 0.61, "arc_easy.acc": 0.47, "tasks_acc_mean": 0.54}
        s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in metrics.items())
    rows = charts.run_rows(finished_jobs)
    assert [(r["id"], r["tasks_acc"]) for r in rows] == [(5, 0.54), (3, None), (2, None), (1, None)]
    assert "tasks_acc" in charts.RUN_COLUMNS and "tasks_acc" in charts.DASHBOARD_METRICS
    spec = charts.metric_vs_ratio(rows, "tasks_acc")
    assert [(p["job"], p["value"], p["ratio"]) for p in spec["data"]["values"]] == [(5, 0.54, 0.3)]
    assert "rule" not in {layer["mark"]["type"] for layer in spec["layer"]}  # the dense line is perplexity's


def test_run_rows_filter_the_succeeded_jobs(finished_jobs):
    rows = charts.run_rows(finished_jobs)
    assert [r["id"] for r in rows] == [3, 2, 1] and rows[2]["dense"] == 15.0 and rows[2]["model"] == "llama-7b"
    # the realised speed-up: end-to-end prefill where the job measured it, else the blocks'; a single
    # timing (no spread) is no number to plot
    speeds = [(r["speedup"], r["speed_of"], r["speedup_text"]) for r in rows]
    assert speeds == [(1.2, "prefill", "1.20× (1.15–1.25)"), (None, "blocks", SINGLE_TIMING), (None, None, "–")]
    assert [r["speedup"] for r in charts.table_rows(rows)] == ["1.20× (1.15–1.25)", SINGLE_TIMING, "–"]
    assert set(charts.RUN_COLUMNS) <= set(rows[0])
    assert [r["id"] for r in charts.run_rows(finished_jobs, user="ada")] == [3, 1]
    assert [r["id"] for r in charts.run_rows(finished_jobs, method="ls")] == [3]
    assert charts.run_rows(finished_jobs, model="13b") == []
    spec = charts.metric_vs_ratio(rows, "perplexity")
    assert _layer(spec, "rule")["data"]["values"][0]["value"] == 15.0  # the dense line from job 1


def test_a_speed_target_job_sits_at_its_reached_ratio_with_its_measured_speed_up(finished_jobs):
    """A job asked for a speed-up has no ratio: the runs table and the plots place it at the ratio it
    reached, its speed-up is the one measured on the target's workload, and the job lists say what it
    asked for."""
    from app.web.views import asked

    with finished_jobs.sessions.begin() as s:
        recipe = {"model": "/m/llama-7b", "target": {"speedup": 1.5, "workload": "decode_b1"}}
        recipe |= {"reconstruction": {"method": "ls"}, "criterion": {"name": "obs"}}
        job = Job(recipe=recipe, evaluations=[], status=Status.SUCCEEDED.value, submitted_by="cy")
        s.add(job)
        s.flush()
        metrics = {"achieved_ratio": 0.41, "perplexity": 40.0, "realised_speedup": 1.52, "prefill_speedup": 1.3}
        metrics |= {"realised_speedup_low": 1.45, "realised_speedup_high": 1.6}
        s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in metrics.items())
        job_id = job.id
    row = next(r for r in charts.run_rows(finished_jobs) if r["id"] == job_id)
    assert (row["ratio"], row["speedup"], row["speed_of"]) == (0.41, 1.52, "target workload")
    info = finished_jobs.show(job_id)
    assert asked(info) == "speed-up 1.5× (decode_b1)"
    assert asked({"ratio": 0.3, "target": None}) == "ratio 0.3"


def test_the_speed_charts_draw_each_run_s_spread_as_an_error_bar():
    rows = [_row(1, 0.2, 6.9, speedup=1.31, speedup_low=1.25, speedup_high=1.36, speed_of="blocks")]
    rows.append(_row(2, 0.4, 9.8, speedup=1.8, speedup_low=1.7, speedup_high=1.9, speed_of="prefill"))
    spec = charts.perplexity_vs_speed(rows)
    bars = _layer(spec, "errorbar")
    assert bars["encoding"]["x"]["field"] == "speedup_low" and bars["encoding"]["x2"] == {"field": "speedup_high"}
    assert bars["encoding"]["y"]["field"] == "value" and bars["encoding"]["color"]["field"] == "series"
    assert [(v["speedup_low"], v["speedup_high"]) for v in spec["data"]["values"]] == [(1.25, 1.36), (1.7, 1.9)]
    assert "least to greatest" in spec["title"]["subtitle"]
    by_ratio = _layer(charts.metric_vs_ratio(rows, "speedup"), "errorbar")["encoding"]
    assert by_ratio["y"]["field"] == "speedup_low" and by_ratio["y2"] == {"field": "speedup_high"}
    assert not any(layer["mark"]["type"] == "errorbar" for layer in charts.metric_vs_ratio(rows, "perplexity")["layer"])


def test_a_speed_up_its_spread_swamps_is_left_off_the_chart_and_the_caption_says_why(job_service):
    """The issue: two identical recipes showed 35.4× and 1.07×, a 50% job 0.651×, each a single timing
    on a busy worker. Neither a noisy figure nor a single timing becomes a point or a confident number."""
    measured = {"block_speedup": 1.31, "block_speedup_low": 1.25, "block_speedup_high": 1.36}
    runs = [
        {"block_speedup": 35.4, "block_speedup_low": 0.9, "block_speedup_high": 41.0},  # spread holds 1
        {"block_speedup": 0.651},  # an older job's single timing
        measured,
    ]
    with job_service.sessions.begin() as s:
        for metrics in runs:
            recipe = {"model": "/m/llama-7b", "ratio": 0.2, "reconstruction": {"method": "liar"}}
            job = Job(recipe=recipe | {"criterion": {"name": "magnitude"}}, evaluations=[])
            job.status, job.submitted_by = Status.SUCCEEDED.value, "ada"
            s.add(job)
            s.flush()
            metrics = {"perplexity": 9.0, "achieved_ratio": 0.2} | metrics
            s.add_all(Metric(job_id=job.id, name=k, value=v) for k, v in metrics.items())
    rows = charts.run_rows(job_service)
    assert [r["speedup_text"] for r in rows] == ["1.31× (1.25–1.36)", SINGLE_TIMING, NOT_MEASURABLE]
    spec = charts.perplexity_vs_speed(rows)
    assert [v["job"] for v in spec["data"]["values"]] == [3]  # only the measurable one is a point
    caption = charts.speed_caption(rows)
    assert caption.startswith("2 runs' speed-up left off") and "not measurable on this worker" in caption
    assert spec["title"]["subtitle"][1] == "2 runs left off: not measurable on this worker (see the note)"
    table = json.dumps(charts.table_rows(rows), ensure_ascii=False)
    assert "35.4" not in table and "0.651" not in table
    assert charts.speed_caption(rows[:1]) == ""


def test_a_re_evaluation_is_no_run_of_its_own(finished_jobs):
    """A re-evaluation's numbers land on the job it evaluated (jobs.reevaluation): the dashboard shows
    that job once, not the re-evaluation beside it as a second point."""
    with finished_jobs.sessions.begin() as s:
        recipe = {"model": "/m/llama-7b", "ratio": 0.2, "reconstruction": {"method": "ls"}}
        recipe["criterion"] = {"name": "magnitude"}
        job = Job(recipe=recipe, evaluations=[], status=Status.SUCCEEDED.value, submitted_by="ada", source_job_id=3)
        s.add(job)
        s.flush()
        s.add(Metric(job_id=job.id, name="perplexity", value=19.5))
    assert [r["id"] for r in charts.run_rows(finished_jobs)] == [3, 2, 1]
