"""The dashboard's rows and the web app's charts as Vega-Lite specifications (plain dicts, no Gradio).

``gr.Plot`` draws a spec with the Vega-Lite bundled in Gradio's frontend (nothing is fetched). The
charts read like the paper's figures:

- :func:`metric_vs_ratio`: a metric against the target pruning ratio, one line per (criterion,
  method) — per model too when several are shown — every run a point (so a series of one ratio shows),
  the dense model as a dashed horizontal line, perplexity on a log scale; a point's tooltip names its
  job and a click on it opens the job (:func:`job_link`).
- :func:`perplexity_vs_size`: perplexity against the parameters kept, the dense model as a point.
- :func:`perplexity_vs_speed`: perplexity against the realised speed-up measured on the worker (end to
  end prefill where the job measured it, else the blocks' forward time), each with an error bar from
  the least to the greatest of its repeated timings, the dense model as a point at 1.0: the trade-off
  a user picks a model from. A speed-up its own spread swamps (``app.web.figures.measurable``), or an
  older job's single timing, is left off and the chart's subtitle says how many were.
- :func:`layer_errors`: a job's relative output error per pruned projection before and after
  reconstruction, with the layers named on the axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.web.figures import SPEEDUPS, measurable, speedup_of, speedup_text
from core.evaluation.tasks import TASKS_ACC_MEAN
from jobs.baseline import DENSE, last_perplexity, window_args
from jobs.service import JobService

RUN_COLUMNS = [
    "id",
    "model",
    "criterion",
    "method",
    "ratio",
    "achieved",
    "perplexity",
    "dense",
    "tasks_acc",
    "params_after",
    "speedup",
    "user",
]
# what the runs table's header shows for each of RUN_COLUMNS (a reader's words, not the keys)
RUN_HEADERS = {
    "id": "job",
    "model": "model",
    "criterion": "criterion",
    "method": "method",
    "ratio": "target ratio",
    "achieved": "achieved",
    "perplexity": "perplexity",
    "dense": "dense perplexity",
    "tasks_acc": "task accuracy (mean)",
    "params_after": "parameters kept",
    "speedup": "speed-up",
    "user": "user",
}
# the runs table's column widths (% of the table, RUN_COLUMNS' order): a long speed-up text wraps in its
# cell instead of pushing the user column off the table
RUN_WIDTHS = ["4%", "13%", "8%", "6%", "6%", "7%", "9%", "9%", "8%", "9%", "12%", "9%"]
# dashboard metric → (axis title, log scale); the names are columns of the runs table
METRICS = {
    "perplexity": ("perplexity (log scale)", True),
    "achieved": ("achieved ratio (fraction of block parameters removed)", False),
    "params_after": ("parameters after pruning", False),
    "speedup": ("realised speed-up (dense time / pruned time)", False),
    "tasks_acc": ("mean accuracy over the lm-eval tasks", False),
}
# where a run's speed-up comes from, in this order of preference: the target's workload, end-to-end
# prefill, the blocks' forward (app.web.figures.SPEEDUPS)
SPEED_METRICS = tuple(SPEEDUPS.items())
DASHBOARD_METRICS = list(METRICS)
SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"  # names the version; never fetched
WIDTH, HEIGHT = 520, 300
SPEED_TITLE = "perplexity vs realised speed-up (◆ dense)"


def job_link(job_id: int) -> str:
    """The app's address of a job (relative: the query string only); the app opens its model page."""
    return f"?job={int(job_id)}"


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def run_rows(service: JobService, model="", method="", user="", criterion="") -> list[dict[str, Any]]:
    """One row of :data:`RUN_COLUMNS` (plus ``params_before``) per succeeded job that passes the
    filters (empty: any; ``model``: a part of its name), newest first. A re-evaluation is no run of
    its own: its numbers are on the job it evaluated (``jobs.reevaluation``)."""
    listed = service.list(status="SUCCEEDED", limit=1000)
    done = [j for j in listed if j.get("source_job") is None and not j.get("export_only")]  # nor is an export
    all_metrics = service.metrics([j["id"] for j in done])
    windows = {i: _window(evs) for i, evs in service.evaluations([j["id"] for j in done]).items()}
    rows = []
    for j in done:
        if (
            (model and model not in str(j["model"]))
            or (method and j["method"] != method)
            or (criterion and j["criterion"] != criterion)
            or (user and j["submitted_by"] != user)
        ):
            continue
        m = all_metrics[j["id"]]
        rows.append(
            {
                "id": j["id"],
                "model": Path(str(j["model"])).name,
                "criterion": j["criterion"],
                "method": j["method"],
                # a speed-target job has no ratio of its own: it sits at the ratio it reached
                "ratio": j["ratio"] if j["ratio"] is not None else _round(m.get("achieved_ratio")),
                "achieved": _round(m.get("achieved_ratio")),
                "perplexity": _round(m.get("perplexity"), 3),
                "dense": _round(m.get(DENSE), 3),
                "tasks_acc": _round(m.get(TASKS_ACC_MEAN)),
                "params_after": m.get("params_after"),
                "user": j["submitted_by"] or "–",
                "params_before": m.get("params_before"),
                "window": windows.get(j["id"]),
                **_speed(m),
            }
        )
    return rows


def _window(evaluations: list[dict[str, Any]]) -> int | None:
    """The window length (tokens) a run's perplexity was measured on; None if it measured none."""
    last = last_perplexity(evaluations)
    return None if last is None else window_args(last)["seq_len"]


def window_label(window: int | None) -> str:
    return f"{window}-token windows" if window else "windows unknown"


def _speed(m: dict[str, Any]) -> dict[str, Any]:
    """A run's speed-up fields: the first of :data:`SPEED_METRICS` recorded with a spread, else the first
    recorded at all (an older job's single timing). ``speedup`` is its median only where it stands out
    of its spread (:func:`~app.web.figures.measurable`) — what the charts plot — else None;
    ``speedup_text`` is what the runs table shows either way."""
    recorded = [k for k, _ in SPEED_METRICS if m.get(k) is not None]
    spread = [k for k in recorded if None not in speedup_of(m, k)]
    key = (spread or recorded or [None])[0]
    if key is None:
        return {"speedup": None, "speedup_low": None, "speedup_high": None, "speedup_text": "–", "speed_of": None}
    median, low, high = speedup_of(m, key)
    return {
        "speedup": _round(median, 3) if measurable(median, low, high) else None,
        "speedup_low": _round(low, 3),
        "speedup_high": _round(high, 3),
        "speedup_text": speedup_text(median, low, high),
        "speed_of": SPEEDUPS[key],
    }


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs table's rows: the speed-up as text, with its spread or why it has no number."""
    return [{**r, "speedup": r.get("speedup_text", r.get("speedup"))} for r in rows]


def table_headers() -> list[str]:
    """The runs table's header, in the order of :data:`RUN_COLUMNS`."""
    return [RUN_HEADERS[c] for c in RUN_COLUMNS]


def left_off(rows: list[dict[str, Any]]) -> int:
    """How many runs recorded a speed-up the charts do not plot (not measurable, or a single timing)."""
    return sum(1 for r in rows if r.get("speed_of") and r.get("speedup") is None)


def speed_caption(rows: list[dict[str, Any]]) -> str:
    """Why runs with a speed-up are missing from the speed charts (empty when none is): the note
    under the dashboard's charts."""
    n = left_off(rows)
    if not n:
        return ""
    runs = "run's" if n == 1 else "runs'"
    return (
        f"{n} {runs} speed-up left off the speed charts: a single timing, or a spread of repeated "
        "timings wider than the speed-up itself — not measurable on this worker."
    )


def _several_windows(rows: list[dict[str, Any]]) -> bool:
    """Whether the runs' perplexities come from more than one window length (not one series, then)."""
    return len({r.get("window") for r in rows if r.get("perplexity") is not None}) > 1


def _series(rows: list[dict[str, Any]]):
    """A run's series: criterion · method, its model when several are shown, its window length when
    runs were measured on several (their perplexities do not compare)."""
    several = len({r["model"] for r in rows}) > 1
    windows = _several_windows(rows)

    def name(r: dict[str, Any]) -> str:
        parts = ([r["model"]] if several else []) + [r["criterion"], r["method"]]
        return " · ".join(parts + ([window_label(r.get("window"))] if windows else []))

    return name


def _dense(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dense model's perplexity per model and window length (from the newest run that has it),
    labelled with the window length when runs were measured on several."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["model"], r.get("window"))
        if r["dense"] is not None and key not in seen:
            seen[key] = {"model": r["model"], "value": r["dense"], "params": r["params_before"]}
            if r.get("window") is not None:
                seen[key]["window"] = r["window"]
    models, windows = len({m for m, _ in seen}) > 1, _several_windows(rows)
    for (model, window), d in seen.items():
        label = f"dense {model}" if models else "dense model"
        d["label"] = f"{label} · {window_label(window)}" if windows else label
    return list(seen.values())


def base_spec(title: str, values: list[dict[str, Any]], width: int = WIDTH) -> dict[str, Any]:
    return {
        "$schema": SCHEMA,
        "title": title,
        "width": width,
        "height": HEIGHT,
        "autosize": {"type": "fit", "contains": "padding"},
        # SVG: crisp, and its marks carry aria labels (the browser tests find the points by them)
        "usermeta": {"embedOptions": {"renderer": "svg", "actions": False}},
        "config": {"legend": {"labelLimit": 320}},  # a series names its window length: not cut short
        "data": {"values": values},
    }


def _tooltip(value_title: str) -> list[dict[str, Any]]:
    return [
        {"field": "job", "type": "ordinal", "title": "job"},
        {"field": "model", "type": "nominal"},
        {"field": "series", "type": "nominal", "title": "criterion · method"},
        {"field": "ratio", "type": "quantitative", "title": "target ratio"},
        {"field": "achieved", "type": "quantitative", "title": "achieved ratio"},
        {"field": "value", "type": "quantitative", "title": value_title},
        {"field": "user", "type": "nominal"},
    ]


def _shape(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's shape by its window length, when runs were measured on several (else nothing)."""
    return {"shape": {"field": "window", "type": "nominal", "title": "perplexity on"}} if _several_windows(rows) else {}


def _points(rows: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    series = _series(rows)
    return [
        {
            "job": r["id"],
            "model": r["model"],
            "series": series(r),
            "ratio": r["ratio"],
            "achieved": r["achieved"],
            "params": r["params_after"],
            "speedup": r.get("speedup"),
            "speedup_low": r.get("speedup_low"),
            "speedup_high": r.get("speedup_high"),
            "speed_of": r.get("speed_of") or "blocks",
            "value": r[field],
            "user": r["user"],
            "window": window_label(r.get("window")),
            "href": job_link(r["id"]),
        }
        for r in rows
        if r.get(field) is not None
    ]


def metric_vs_ratio(rows: list[dict[str, Any]], metric: str = "perplexity") -> dict[str, Any] | None:
    """``metric`` against the target ratio (see the module docstring); None if no run has it."""
    title, log = METRICS[metric]
    points = [p for p in _points(rows, metric) if not log or p["value"] > 0]
    if not points:
        return None
    y = {"field": "value", "type": "quantitative", "title": title, "scale": {"type": "log"} if log else {"zero": False}}
    x = {"field": "ratio", "type": "quantitative", "title": "target pruning ratio", "scale": {"zero": False}}
    color = {"field": "series", "type": "nominal", "title": "criterion · method"}
    layers: list[dict[str, Any]] = [
        {  # one line per series through the mean of its runs at each ratio
            "mark": {"type": "line"},
            "encoding": {"x": x, "y": {**y, "aggregate": "mean"}, "color": color},
        },
        {
            "mark": {"type": "point", "filled": True, "size": 90, "cursor": "pointer"},
            "encoding": {
                "x": x,
                "y": y,
                "color": color,
                "tooltip": _tooltip(metric),
                "href": {"field": "href"},
                **_shape(rows),
            },
        },
    ]
    if metric == "speedup":  # the spread of the repeated timings: least to greatest
        layers.append(_error_bars({"x": x, "y": {**y, "field": "speedup_low"}, "y2": {"field": "speedup_high"}}))
    dense = _dense(rows) if metric == "perplexity" else []
    if dense:
        layers += _dense_rule(dense, min(p["ratio"] for p in points))
    spec = base_spec(f"{metric} vs pruning ratio", points)
    if metric == "speedup":
        spec["title"] = _speed_title(spec["title"], rows)
    spec["layer"] = layers
    return spec


def _speed_title(title: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A speed chart's title, its subtitle saying what the bars are and how many runs are left off."""
    note, n = "bars: least to greatest of each run's repeated timings", left_off(rows)
    dropped = f"{n} run{'s' * (n != 1)} left off: not measurable on this worker (see the note)"
    return {"text": title, "subtitle": [note, dropped] if n else note}


def _error_bars(encoding: dict[str, Any]) -> dict[str, Any]:
    """A layer of error bars (``x``/``y`` and ``x2``/``y2`` the ends of each run's spread), in its
    series' colour; runs without a spread draw none."""
    color = {"field": "series", "type": "nominal", "title": "criterion · method"}
    return {"mark": {"type": "errorbar", "ticks": True}, "encoding": {**encoding, "color": color}}


def _dense_rule(dense: list[dict[str, Any]], left: float) -> list[dict[str, Any]]:
    y = {"field": "value", "type": "quantitative"}
    tooltip = [{"field": "label", "title": "baseline"}, {"field": "value", "title": "perplexity"}]
    return [
        {
            "data": {"values": dense},
            "mark": {"type": "rule", "strokeDash": [6, 4], "color": "#555"},
            "encoding": {"y": y, "tooltip": tooltip},
        },
        {
            "data": {"values": dense},
            "mark": {"type": "text", "align": "left", "dy": -7, "color": "#555"},
            "encoding": {"y": y, "x": {"datum": left, "type": "quantitative"}, "text": {"field": "label"}},
        },
    ]


def _dense_points(dense: list[dict[str, Any]], x: str, labelled: bool) -> list[dict[str, Any]]:
    """The dense model as a grey diamond at (``x``, its perplexity); ``labelled``: its label beside it
    (which window length each is, when runs were measured on several)."""
    if not dense:
        return []
    encoding = {"x": {"field": x, "type": "quantitative"}, "y": {"field": "value", "type": "quantitative"}}
    tooltip = [{"field": "label", "title": "baseline"}, {"field": "value", "title": "perplexity"}]
    diamond = {"type": "point", "shape": "diamond", "size": 140, "filled": True, "color": "#555"}
    layers = [{"data": {"values": dense}, "mark": diamond, "encoding": {**encoding, "tooltip": tooltip}}]
    if labelled:
        text = {"type": "text", "align": "right", "dx": -9, "dy": -8, "fontSize": 10, "color": "#555"}
        layers.append({"data": {"values": dense}, "mark": text, "encoding": {**encoding, "text": {"field": "label"}}})
    return layers


def perplexity_vs_size(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Perplexity (log scale) against the parameters kept, each run a point, the dense model too."""
    points = [p for p in _points(rows, "perplexity") if p["value"] > 0 and p["params"]]
    if not points:
        return None
    x = {"field": "params", "type": "quantitative", "title": "parameters", "axis": {"format": "~s"}}
    y = {"field": "value", "type": "quantitative", "title": "perplexity (log scale)", "scale": {"type": "log"}}
    layers: list[dict[str, Any]] = [
        {
            "mark": {"type": "point", "filled": True, "size": 90, "cursor": "pointer"},
            "encoding": {
                "x": x,
                "y": y,
                "color": {"field": "series", "type": "nominal", "title": "criterion · method"},
                "tooltip": _tooltip("perplexity"),
                "href": {"field": "href"},
                **_shape(rows),
            },
        }
    ]
    dense = [d for d in _dense(rows) if d["params"]]
    layers += _dense_points(dense, "params", _several_windows(rows))
    spec = base_spec("perplexity vs parameters kept (◆ dense)", points)
    spec["layer"] = layers
    return spec


def perplexity_vs_speed(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Perplexity (log scale) against the realised speed-up, one line per series in ratio order, every
    run a point, the dense model a point at 1.0; None if no run has both."""
    points = [p for p in _points(rows, "perplexity") if p["value"] > 0 and p["speedup"]]
    if not points:
        return None
    x = {"field": "speedup", "type": "quantitative", "title": "realised speed-up (× dense)", "scale": {"zero": False}}
    y = {"field": "value", "type": "quantitative", "title": "perplexity (log scale)", "scale": {"type": "log"}}
    color = {"field": "series", "type": "nominal", "title": "criterion · method"}
    tooltip = _tooltip("perplexity") + [
        {"field": "speedup", "type": "quantitative", "title": "speed-up"},
        {"field": "speedup_low", "type": "quantitative", "title": "least"},
        {"field": "speedup_high", "type": "quantitative", "title": "greatest"},
        {"field": "speed_of", "type": "nominal", "title": "measured on"},
    ]
    layers: list[dict[str, Any]] = [
        {"mark": {"type": "line"}, "encoding": {"x": x, "y": y, "color": color, "order": {"field": "ratio"}}},
        _error_bars({"x": {**x, "field": "speedup_low"}, "x2": {"field": "speedup_high"}, "y": y}),
        {
            "mark": {"type": "point", "filled": True, "size": 90, "cursor": "pointer"},
            "encoding": {"x": x, "y": y, "color": color, "tooltip": tooltip, "href": {"field": "href"}, **_shape(rows)},
        },
    ]
    dense = [{**d, "speedup": 1.0} for d in _dense(rows)]
    layers += _dense_points(dense, "speedup", _several_windows(rows))
    spec = base_spec(SPEED_TITLE, points)
    spec["title"] = _speed_title(spec["title"], rows)
    spec["layer"] = layers
    return spec


MODULE_LABELS = {"attention": "attn", "ffn": "ffn"}


def layer_errors(report: list[dict[str, Any]] | None, width: int = 1000) -> dict[str, Any] | None:
    """The relative output error of each pruned projection before ("pruned") and after
    ("reconstructed") reconstruction, in layer order, the projections named (``12 attn``)."""
    if not report:
        return None
    values = [
        {
            "projection": f"{r['layer']} {MODULE_LABELS.get(r['module'], r['module'])}",
            "order": i,
            "error": r[key],
            "when": when,
            "kept": f"{r['kept']}/{r['total']}",
        }
        for i, r in enumerate(report)
        for key, when in (("error_before", "pruned"), ("error_after", "reconstructed"))
    ]
    x = {
        "field": "projection",
        "type": "ordinal",
        "sort": {"field": "order"},
        "title": "layer · pruned unit",
        "axis": {"labelAngle": -45, "labelOverlap": True},
    }
    tooltip = [
        {"field": "projection", "title": "layer · unit"},
        {"field": "kept", "title": "kept"},
        {"field": "when"},
        {"field": "error", "type": "quantitative", "format": ".4f", "title": "relative error"},
    ]
    encoding = {
        "x": x,
        "y": {"field": "error", "type": "quantitative", "title": "relative output error"},
        "color": {"field": "when", "type": "nominal", "title": None, "sort": ["pruned", "reconstructed"]},
        "tooltip": tooltip,
    }
    spec = base_spec("relative output error per pruned unit (layer order)", values, width)
    spec["layer"] = [
        {"mark": {"type": "line"}, "encoding": encoding},
        {"mark": {"type": "point"}, "encoding": encoding},
    ]
    return spec
