"""The "Jobs" tab: a live table of recent jobs; select a row to follow its log and stage timings,
cancel it, re-run it, run its failed evaluations again without pruning (``jobs.reevaluation``),
delete it (its owner or an admin: ``jobs.access``; for anyone else those buttons show disabled) or open
its model page."""

from __future__ import annotations

import gradio as gr

from app.web import confirm_delete, views
from app.web.auth import Login
from jobs.service import JobService

REFRESH_SECONDS = 2.0


def build(service: JobService, login: Login) -> tuple[gr.State, gr.Button]:
    """The tab's components, inside the current ``gr.Tab``, and their events; returns the picked job
    (a ``gr.State``) and the "Model page" button, which the app wires to the Model tab."""
    status_filter = gr.Dropdown(views.STATUSES, value="", label="Status")
    table = gr.Dataframe(
        headers=views.TABLE_COLUMNS,
        value=lambda: views.job_rows(service),
        interactive=False,
        label="Jobs — select a row to follow it",
        column_widths=views.TABLE_WIDTHS,
        wrap=True,  # a speed target's "speed-up 1.5× (decode_b1)" wraps in its cell, not over the others
        elem_id="jobs-table",
    )
    picked = gr.State(None)
    heading = gr.Markdown(views.job_panel(service, None)[0], elem_id="job-heading")
    with gr.Row():
        cancel_btn = gr.Button("Cancel job", variant="stop", interactive=False)  # until a job that can stop is picked
        rerun_btn = gr.Button("Re-run", interactive=False)  # until a job of the viewer's is picked
        # usable once a succeeded job whose evaluations failed is picked; not "Re-run …": one button has that name
        reevaluate_btn = gr.Button("Re-evaluate", interactive=False)
        delete_btn = gr.Button("Delete job", interactive=False)  # until a finished job is picked
        open_btn = gr.Button("Model page ›")
    job_msg = gr.Markdown(elem_id="job-message")
    question = confirm_delete.DeleteQuestion()  # Delete asks here first, naming what goes
    with gr.Row():
        # the last lines only, so no line numbers (they counted from the tail and drifted as lines came in);
        # each line carries its time
        log_tail = gr.Code(
            label="Log (live, newest last)", language=None, show_line_numbers=False, wrap_lines=True, elem_id="job-log"
        )
        timings = gr.Markdown(elem_id="job-timings")
    timer = gr.Timer(REFRESH_SECONDS)
    panel = [heading, log_tail, timings]

    def view(job_id, message, request) -> list:
        """The panel; Cancel, Delete, Re-evaluate and Re-run usable or not by whoever looks (a job of
        someone else's shows them disabled); the action message, gone once it is stale (views.job_view)."""
        shown = views.job_view(service, job_id, actor=login.actor(request))
        usable = (*shown.buttons, shown.rerun)
        stale = views.stale_message(message, shown)
        return [*shown.panel, *(gr.update(interactive=on) for on in usable), "" if stale else gr.skip()]

    def pick(message, evt: gr.SelectData, request: gr.Request = None):
        job_id = views.job_id_of(evt.row_value)
        return job_id, *view(job_id, message, request)

    def refresh(status, job_id, message, request: gr.Request = None):
        rows = views.job_rows(service, status)
        if job_id is None:
            return rows, *(gr.skip() for _ in outputs)
        return rows, *view(job_id, message, request)

    states = [cancel_btn, delete_btn, reevaluate_btn, rerun_btn]  # the order of views.Buttons, then Re-run
    outputs = [*panel, *states, job_msg]
    table.select(pick, [job_msg], [picked, *outputs], api_name=False)
    timer.tick(refresh, [status_filter, picked, job_msg], [table, *outputs], api_name=False)
    status_filter.change(refresh, [status_filter, picked, job_msg], [table, *outputs], api_name=False)

    # the account that clicked acts (and is a re-run's submitter)
    def cancel(job_id, request: gr.Request = None):
        return views.cancel_job(service, job_id, login.actor(request))

    def rerun(job_id, request: gr.Request = None):
        return views.rerun_job(service, job_id, login.actor(request))

    def reevaluate(job_id, request: gr.Request = None):
        return views.reevaluate_job(service, job_id, login.actor(request))

    def panel_of(job_id) -> list:  # the panel and its buttons for the delete question (no message)
        return view(job_id, "", None)[:-1]

    actions = ((cancel_btn, cancel), (rerun_btn, rerun), (reevaluate_btn, reevaluate))
    events = [button.click(action, [picked], [job_msg], api_name=False) for button, action in actions]
    events += question.wire(service, login, delete_btn, picked, job_msg, panel_of, [*panel, *states])
    for event in events:
        event.then(refresh, [status_filter, picked, job_msg], [table, *outputs], api_name=False)
    return picked, open_btn
