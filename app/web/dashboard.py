"""The "Dashboard" tab: finished runs, filtered; a metric against the pruning ratio as in the paper's
figures, perplexity against the parameters kept and against the realised speed-up (with its spread;
the note under the charts says how many runs' speed-ups were not measurable, the table which), and
the runs table (charts: ``app.web.charts``)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from app.web import charts, forms
from jobs.service import JobService

HINT = "Hover a point for its job; click it (or a row of the table) to open the job."
NO_RUNS = "No succeeded runs match these filters."


def vega(spec: dict[str, Any] | None):
    """A Vega-Lite spec as the value of a ``gr.Plot`` (drawn by the Vega-Lite in Gradio's frontend)."""
    from gradio.components.plot import PlotData

    return None if spec is None else PlotData(type="altair", plot=json.dumps(spec))


def build(service: JobService, demo: gr.Blocks, tab: gr.Tab) -> gr.Dataframe:
    """The tab's components, inside ``tab``, and their events (run when a filter changes, when the
    tab is opened and when ``demo`` loads); returns the runs table (a selected row opens its job)."""
    with gr.Row():
        f_model = gr.Textbox(label="Model contains")
        f_method = gr.Dropdown([""] + forms.METHODS, value="", label="Method")
        f_criterion = gr.Dropdown([""] + forms.CRITERIA, value="", label="Criterion")
        f_user = gr.Textbox(label="User")
        f_metric = gr.Dropdown(charts.DASHBOARD_METRICS, value="perplexity", label="Metric")
        refresh = gr.Button("Refresh")
    with gr.Row():
        by_ratio = gr.Plot(show_label=False, elem_id="ratio-plot")
        by_size = gr.Plot(show_label=False, elem_id="size-plot")
    with gr.Row():
        by_speed = gr.Plot(show_label=False, elem_id="speed-plot")
    note = gr.Markdown(HINT, elem_id="dashboard-note")
    runs = gr.Dataframe(headers=charts.RUN_COLUMNS, interactive=False, elem_id="runs-table")

    def dashboard(model, method, criterion, user, metric):
        import pandas as pd

        rows = charts.run_rows(service, model, method, user, criterion)
        table = pd.DataFrame(charts.table_rows(rows), columns=charts.RUN_COLUMNS)
        text = " ".join(filter(None, (HINT, charts.speed_caption(rows)))) if rows else NO_RUNS
        plots = (
            charts.metric_vs_ratio(rows, metric),
            charts.perplexity_vs_size(rows),
            charts.perplexity_vs_speed(rows),
        )
        return *map(vega, plots), text, table

    gr.on(
        [refresh.click, f_metric.change, f_method.change, f_criterion.change, f_model.submit, f_user.submit]
        + [f_model.blur, f_user.blur, tab.select, demo.load],
        dashboard,
        [f_model, f_method, f_criterion, f_user, f_metric],
        [by_ratio, by_size, by_speed, note, runs],
        api_name=False,
    )
    return runs
