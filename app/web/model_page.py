"""The "Model" tab: one job's metrics, stage timings, recipe, per-layer error (table and chart), how to
load it, and its checkpoint to download (the whole of it as one file, or file by file with sizes and
sha256)."""

from __future__ import annotations

import gradio as gr

from app.web import exports_panel, try_model, views
from app.web.auth import Login
from app.web.dashboard import vega
from jobs.service import JobService


def build(service: JobService, login: Login) -> gr.Number:
    """The tab's components, inside the current ``gr.Tab``, and their events; returns the job id box
    (the Jobs tab, the dashboard and ``?job=N`` links set it)."""
    page_id = gr.Number(None, label="Job id", precision=0, elem_id="model-job-id")
    head = gr.Markdown(elem_id="model-head")
    load = gr.Markdown(elem_id="model-load")
    download = gr.Markdown(elem_id="model-downloads")  # links to app.web.downloads' routes
    try_model.build(service, login, page_id)  # the prompt box: pruned and dense side by side
    exports_panel.build(service, login, page_id)  # serving forms, exported after the fact
    layers = gr.Plot(show_label=False, elem_id="error-plot")
    with gr.Row():
        with gr.Column():
            gr.Markdown("#### Recipe")
            page_recipe = gr.HTML(elem_id="model-recipe")  # every line numbered: views.numbered_yaml
        page_report = gr.Dataframe(
            headers=views.REPORT_HEADERS, label="Per-layer reconstruction error", interactive=False
        )

    def show(job_id, request: gr.Request = None):
        page = views.model_page(service, job_id, login.actor(request))
        recipe = views.numbered_yaml(page.recipe)
        return page.head, page.load, page.downloads, vega(page.layers), recipe, page.report

    page_id.change(show, [page_id], [head, load, download, layers, page_recipe, page_report], api_name=False)
    page_id.change(None, [page_id], None, js=LINK_JS, api_name=False)  # the address names the open job
    return page_id


# the page's address follows the open job (``?job=N``): a reload, or the address copied for a colleague,
# opens the same page (``openers`` reads it)
LINK_JS = """(id) => {
    if (id) {
        const address = new URL(window.location.href);
        address.searchParams.set("job", Math.trunc(id));
        window.history.replaceState(null, "", address);
    }
}"""


def openers(
    demo: gr.Blocks, tabs: gr.Tabs, page_id: gr.Number, picked: gr.State, open_picked: gr.Button, runs: gr.Dataframe
) -> None:
    """What opens a job's model page: the Jobs tab's button (its picked job), a row of the
    dashboard's runs table, and the app's address with ``?job=N`` (a chart point's link, or one
    shared by a colleague)."""

    def open_job(job_id):
        job_id = views.job_id_of(job_id)
        return (gr.skip(), gr.skip()) if job_id is None else (gr.Tabs(selected="model"), job_id)

    def open_row(evt: gr.SelectData):
        return open_job(evt.row_value)

    def open_link(request: gr.Request = None):
        return open_job(request.query_params.get("job") if request else None)

    open_picked.click(open_job, [picked], [tabs, page_id], api_name=False)
    runs.select(open_row, None, [tabs, page_id], api_name=False)
    demo.load(open_link, None, [tabs, page_id], api_name=False)
