"""The "Model" tab: one job's recipe, metrics, stage timings, per-layer error, model card, and its
checkpoint to download (the whole of it as one file, or file by file with sizes and sha256)."""

from __future__ import annotations

import gradio as gr

from app.web import forms
from jobs.service import JobService


def build(service: JobService) -> None:
    """The tab's components, inside the current ``gr.Tab``, and their events."""
    page_id = gr.Number(None, label="Job id", precision=0, elem_id="model-job-id")
    head = gr.Markdown()
    with gr.Row():
        page_recipe = gr.Code(label="Recipe", language="yaml")
        page_report = gr.Dataframe(
            headers=forms.REPORT_HEADERS, label="Per-layer reconstruction error", interactive=False
        )
    error_plot = gr.LinePlot(
        x="step",
        y="error",
        color="when",
        title="relative output error per pruned projection (layer order)",
        elem_id="error-plot",
    )
    download = gr.Markdown(elem_id="model-downloads")  # links to app.web.downloads' routes
    card = gr.Markdown()
    page_id.change(
        lambda job_id: forms.model_page(service, job_id),
        [page_id],
        [head, page_recipe, page_report, card, download, error_plot],
        api_name=False,
    )
