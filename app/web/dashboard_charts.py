"""The dashboard's three charts as ``app.web.charts`` draws them, each titled; a chart with nothing to draw
is its title and, in its place, one sentence saying why (not an empty, untitled box)."""

from __future__ import annotations

import textwrap
from typing import Any

from app.web import charts


def placeholder(title: str, reason: str) -> dict[str, Any]:
    """A chart with nothing to draw: its title, and in its place one sentence saying why."""
    spec = charts.base_spec(title, [{"reason": textwrap.wrap(reason, 60)}])  # a list: one line each
    spec["height"] = charts.HEIGHT // 2
    spec["mark"] = {"type": "text", "fontSize": 14, "color": "#555"}
    spec["encoding"] = {"text": {"field": "reason"}}
    spec["config"] = {"view": {"stroke": None}}
    return spec


NO_RUNS = "No succeeded runs match these filters."


def dashboard_charts(rows: list[dict[str, Any]], metric: str = "perplexity") -> list[dict[str, Any]]:
    """The dashboard's three charts (metric vs ratio, perplexity vs parameters kept, perplexity vs
    speed-up), each titled; one with nothing to draw says why in its place (:func:`placeholder`)."""
    titles = (f"{metric} vs pruning ratio", "perplexity vs parameters kept (◆ dense)", charts.SPEED_TITLE)
    if not rows:
        return [placeholder(t, NO_RUNS) for t in titles]
    n = charts.left_off(rows)
    if n:
        runs = "1 run was" if n == 1 else f"{n} runs were"
        slow = f"No run's speed-up is measurable on this worker: {runs} timed once or spread wider than the speed-up."
    else:
        slow = "No run among these measured both a speed-up and a perplexity."
    reasons = (
        f"No run among these recorded {charts.METRICS[metric][0].split(' (')[0]}.",
        "No run among these recorded both a perplexity and its parameter count.",
        slow,
    )
    drawn = (charts.metric_vs_ratio(rows, metric), charts.perplexity_vs_size(rows), charts.perplexity_vs_speed(rows))
    return [spec or placeholder(t, why) for spec, t, why in zip(drawn, titles, reasons, strict=True)]
