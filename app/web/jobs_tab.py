"""The "Jobs" tab: a live table of recent jobs; cancel, re-run, and the log tail and stage timings of one."""

from __future__ import annotations

import gradio as gr

from app.web import forms
from jobs.service import JobService

REFRESH_SECONDS = 2.0


def build(service: JobService) -> None:
    """The tab's components, inside the current ``gr.Tab``, and their events."""
    status_filter = gr.Dropdown(forms.STATUSES, value="", label="Status")
    table = gr.Dataframe(
        headers=forms.TABLE_COLUMNS, value=lambda: forms.job_rows(service), interactive=False, elem_id="jobs-table"
    )
    with gr.Row():
        job_pick = gr.Number(None, label="Job id", precision=0)
        cancel_btn = gr.Button("Cancel job", variant="stop")
        rerun_btn = gr.Button("Re-run")
    job_msg = gr.Markdown()
    with gr.Row():
        log_tail = gr.Code(label="Log tail", language=None)
        timings = gr.Markdown(elem_id="job-timings")
    timer = gr.Timer(REFRESH_SECONDS)

    def rows(status):
        return forms.job_rows(service, status)

    def picked(job_id):
        return forms.job_panel(service, job_id)

    def tick(status, job_id):
        return (rows(status), *picked(job_id)) if job_id else (rows(status), gr.skip(), gr.skip())

    timer.tick(tick, [status_filter, job_pick], [table, log_tail, timings], api_name=False)
    status_filter.change(rows, [status_filter], [table], api_name=False)
    cancel_btn.click(lambda job_id: forms.cancel_job(service, job_id), [job_pick], [job_msg], api_name=False)
    rerun_btn.click(lambda job_id: forms.rerun_job(service, job_id), [job_pick], [job_msg], api_name=False)
    job_pick.change(picked, [job_pick], [log_tail, timings], api_name=False)
