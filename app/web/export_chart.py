"""The Model page's chart of a job's exports: each GGUF file's held-out perplexity in llama.cpp against
its size, the job's own checkpoint (unquantized) as the reference point, and a one-line caption; where
no export has a measured perplexity, one sentence saying why in the chart's place.

The numbers are the export jobs' own (``jobs.export_quality``: a row per form, the windows scored and
the reference on the same windows); :func:`chart_data` reads them into the points, :func:`spec` draws
them as the dashboard's charts are drawn (``app.web.charts``: Vega-Lite, log scales, the reference a
grey diamond), :func:`reason` words an empty chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.web import charts
from app.web.dashboard_charts import placeholder
from jobs import export_quality as q
from jobs.baseline import last_perplexity

TITLE = "held-out perplexity vs file size (◆ the job's own checkpoint)"


@dataclass
class ChartData:
    """What the chart draws: a point per measured GGUF export, the reference, the windows scored."""

    source: int
    points: list[dict[str, Any]] = field(default_factory=list)
    reference: dict[str, Any] | None = None  # the job's checkpoint: size, value (perplexity), label
    windows: int | None = None  # windows each file was scored on
    total: int | None = None  # windows of the job's evaluation
    seq_len: int | None = None


def chart_data(source: int, exports: list[dict[str, Any]]) -> ChartData:
    """The chart's points from job ``source``'s export jobs (``[{"id", "status", "metrics"}]``, oldest
    first): every form of a succeeded export with a measured perplexity, and the reference and windows
    of the newest export that recorded them."""
    data = ChartData(source)
    for j in exports:
        if j["status"] != "SUCCEEDED":
            continue
        m = j.get("metrics") or {}
        for form, row in q.form_rows(m).items():
            if row.get("perplexity") is None or not row.get("bytes"):
                continue
            data.points.append(
                {
                    "job": j["id"],
                    "form": form,
                    "quant": form.removeprefix("gguf-"),
                    "size": row["bytes"],
                    "mib": round(row["bytes"] / 2**20, 2),
                    "value": row["perplexity"],
                    "fallbacks": int(row.get("fallbacks") or 0),
                    "href": charts.job_link(j["id"]),
                }
            )
        if m.get(q.REFERENCE_PERPLEXITY) and m.get(q.REFERENCE_BYTES):
            label = f"job {source} (unquantized)"
            data.reference = {"size": m[q.REFERENCE_BYTES], "value": m[q.REFERENCE_PERPLEXITY], "label": label}
            data.reference["mib"] = round(m[q.REFERENCE_BYTES] / 2**20, 2)
        if m.get(q.EVAL_WINDOWS):
            data.windows, data.total = int(m[q.EVAL_WINDOWS]), int(m.get(q.EVAL_TOTAL) or m[q.EVAL_WINDOWS])
            data.seq_len = int(m.get(q.EVAL_SEQ_LEN) or 0) or None
    data.points.sort(key=lambda p: p["size"])
    return data


def spec(data: ChartData) -> dict[str, Any] | None:
    """Perplexity (log scale) against file size (log scale), each form a labelled point linking to its
    export job, the job's checkpoint a grey diamond; None without a point."""
    if not data.points:
        return None
    x = {"field": "size", "type": "quantitative", "title": "file size (bytes, log scale)", "scale": {"type": "log"}}
    x["axis"] = {"format": "~s"}
    y = {"field": "value", "type": "quantitative", "title": "held-out perplexity (log scale)", "scale": {"type": "log"}}
    tooltip = [
        {"field": "form", "type": "nominal"},
        {"field": "job", "type": "ordinal", "title": "export job"},
        {"field": "mib", "type": "quantitative", "title": "MiB"},
        {"field": "value", "type": "quantitative", "title": "perplexity", "format": ".4g"},
        {"field": "fallbacks", "type": "quantitative", "title": "tensors fallen back"},
    ]
    point = {"type": "point", "filled": True, "size": 90, "cursor": "pointer"}
    label = {"type": "text", "align": "left", "dx": 8, "dy": -6, "fontSize": 11}
    layers: list[dict[str, Any]] = [
        {"mark": point, "encoding": {"x": x, "y": y, "tooltip": tooltip, "href": {"field": "href"}}},
        {"mark": label, "encoding": {"x": x, "y": y, "text": {"field": "quant"}}},
    ]
    if data.reference is not None:
        layers += charts._dense_points([data.reference], "size", labelled=True)
    out = charts.base_spec(TITLE, data.points)
    out["layer"] = layers
    return out


def caption(data: ChartData, text: str) -> str:
    """One line under the chart: what was scored, on which windows, against what."""
    if data.windows and data.total and data.windows < data.total:
        windows = f"the first {data.windows} of the job's {data.total} windows"
    else:
        windows = f"the job's {data.total or data.windows or '?'} windows"
    tokens = f" of {data.seq_len} tokens" if data.seq_len else ""
    versus = (
        f"◆ job {data.source}'s own checkpoint (unquantized, torch) on the same windows"
        if data.reference is not None
        else f"job {data.source}'s own perplexity on those windows was not recorded"
    )
    return (
        f"Each GGUF export's perplexity in llama.cpp on {windows}{tokens} of {text}, against its file size; {versus}."
    )


def reason(data: ChartData, exports: list[dict[str, Any]], evaluated: bool) -> str:
    """Why the chart has no point, in one sentence."""
    done = [j for j in exports if j["status"] == "SUCCEEDED"]
    if not evaluated:
        return (
            f"Job {data.source} names no evaluation text (it ran no perplexity evaluation), so its exports' "
            "held-out perplexity is not measured."
        )
    if not done:
        return "No export of this checkpoint has finished yet."
    if all(set(j.get("forms") or []) <= {"vllm"} for j in done):
        return "Only the vLLM form was exported, and held-out perplexity is measured for GGUF files, in llama.cpp."
    return (
        "No finished GGUF export has a measured perplexity: one written before exports were scored, or whose "
        "scoring failed (its log says why), has no point."
    )


def view(service, job_id: int, exports: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the chart's spec, or its title and the sentence saying why it is empty; the caption) for job
    ``job_id``'s export jobs (``jobs.export_jobs.listing``); (None, "") where it has none."""
    if not exports:
        return None, ""
    metrics = service.metrics([j["id"] for j in exports])
    data = chart_data(job_id, [{**j, "metrics": metrics.get(j["id"], {})} for j in exports])
    evaluation = last_perplexity(service.evaluations([job_id]).get(job_id))
    drawn = spec(data)
    if drawn is None:
        return placeholder(TITLE, reason(data, exports, evaluation is not None)), ""
    return drawn, caption(data, str(evaluation["dataset"]) if evaluation else "the evaluation text")
