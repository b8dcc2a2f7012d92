"""The "Dashboard" tab: finished runs, filtered, and a metric plotted against the ratio and the size."""

from __future__ import annotations

import gradio as gr

from app.web import forms
from jobs.service import JobService


def build(service: JobService, demo: gr.Blocks) -> None:
    """The tab's components, inside the current ``gr.Tab``, and their events (also run when ``demo`` loads)."""
    with gr.Row():
        f_model = gr.Textbox(label="Model contains")
        f_method = gr.Dropdown([""] + forms.METHODS, value="", label="Method")
        f_criterion = gr.Dropdown([""] + forms.CRITERIA, value="", label="Criterion")
        f_user = gr.Textbox(label="User")
        f_metric = gr.Dropdown(forms.DASHBOARD_METRICS, value="perplexity", label="Metric")
        refresh = gr.Button("Refresh")
    runs = gr.Dataframe(interactive=False, elem_id="runs-table")
    with gr.Row():
        ppl_plot = gr.LinePlot(x="ratio", y="value", color="method", title="perplexity vs ratio", elem_id="ppl-plot")
        size_plot = gr.ScatterPlot(x="params_after", y="value", color="method", title="parameters kept vs perplexity")

    def dashboard(model, method, user, metric="perplexity", criterion=""):
        df, plot_df = forms.dashboard_data(service, model, method, user, metric, criterion)
        return (
            df,
            gr.update(value=plot_df, title=f"{metric} vs ratio (per method)"),
            gr.update(value=plot_df, title=f"parameters kept vs {metric}"),
        )

    filters = [f_model, f_method, f_user, f_metric, f_criterion]
    outputs = [runs, ppl_plot, size_plot]
    refresh.click(dashboard, filters, outputs, api_name=False)
    f_metric.change(dashboard, filters, outputs, api_name=False)
    demo.load(dashboard, filters, outputs, api_name=False)
