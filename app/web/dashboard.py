"""The "Dashboard" tab: finished runs, filtered; a metric against the pruning ratio as in the paper's
figures, perplexity against the parameters kept and against the realised speed-up (with its spread;
the note under the charts says how many runs' speed-ups were not measurable, the table which; a chart
with nothing to draw says why in its place), and the runs table, its columns named for readers
(charts: ``app.web.charts``)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from app.web import charts, dashboard_charts, forms
from jobs.service import JobService

HINT = "Hover a point for its job; click it (or a row of the table) to open the job."
NO_RUNS = dashboard_charts.NO_RUNS


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
    runs = gr.Dataframe(
        headers=charts.table_headers(),
        column_widths=charts.RUN_WIDTHS,  # every column, the user last, within the page's width
        interactive=False,
        wrap=True,
        elem_id="runs-table",
    )

    def dashboard(model, method, criterion, user, metric):
        import pandas as pd

        rows = charts.run_rows(service, model, method, user, criterion)
        table = pd.DataFrame(charts.table_rows(rows), columns=charts.RUN_COLUMNS)
        table.columns = charts.table_headers()
        text = " ".join(filter(None, (HINT, charts.speed_caption(rows)))) if rows else NO_RUNS
        return *map(vega, dashboard_charts.dashboard_charts(rows, metric)), text, table

    gr.on(
        [refresh.click, f_metric.change, f_method.change, f_criterion.change, f_model.submit, f_user.submit]
        + [f_model.blur, f_user.blur, tab.select, demo.load],
        dashboard,
        [f_model, f_method, f_criterion, f_user, f_metric],
        [by_ratio, by_size, by_speed, note, runs],
        api_name=False,
    )
    return runs
