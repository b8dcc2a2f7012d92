"""The named API endpoints, for ``gradio_client``: ``/submit``, ``/list_jobs``, ``/show_job``,
``/cancel_job``, ``/download``."""

from __future__ import annotations

import json

import gradio as gr

from app.web import forms
from jobs.service import JobService, SubmitError


def build(service: JobService) -> None:
    """Register the endpoints on the current ``gr.Blocks``."""

    def api_submit(
        recipe_yaml: str, user: str = "", ppl: str = "", ppl_seq_len: int = 0, request: gr.Request = None
    ) -> dict:
        """Submit a recipe given as YAML; returns {"id": N} or raises with the validation message.
        ``ppl``: evaluate perplexity after pruning on this named set or text file (in the server's data
        folders), over ``ppl_seq_len``-token windows (0: 512, or the model's positions if fewer)."""
        try:
            evaluations = forms.api_evaluations(recipe_yaml, ppl, ppl_seq_len)
            submitter = forms.submitter(user, request)
            return {"id": service.submit(recipe_yaml, submitted_by=submitter, evaluations=evaluations, confine=True)}
        except SubmitError as exc:
            raise gr.Error(str(exc)) from None

    # list/show return JSON text: a JSON output holding file paths makes gradio_client try to fetch them
    def api_list(status: str = "") -> str:
        """Recent jobs as a JSON list (id, status, stage, layer, n_layers, progress, model, ratio, …)."""
        return json.dumps(service.list(status=status or None))

    def api_show(job_id: float) -> str:
        """One job as a JSON object: status, progress, recipe, metrics, artifacts, per-layer report, log."""
        try:
            return json.dumps(service.show(int(job_id)))
        except KeyError as exc:
            raise gr.Error(str(exc.args[0])) from None

    def api_cancel(job_id: float) -> str:
        try:
            return service.cancel(int(job_id))
        except KeyError as exc:
            raise gr.Error(str(exc.args[0])) from None

    def api_download(job_id: float) -> str:
        """The job's checkpoint archive (.tar.gz)."""
        try:
            return str(service.artifact(int(job_id), "archive"))
        except KeyError as exc:
            raise gr.Error(f"{exc.args[0]} (is the job finished?)") from None

    gr.api(api_submit, api_name="submit")
    gr.api(api_list, api_name="list_jobs")
    gr.api(api_show, api_name="show_job")
    gr.api(api_cancel, api_name="cancel_job")
    with gr.Row(visible=False):
        dl_id = gr.Number(precision=0)
        dl_file = gr.File()
        gr.Button().click(api_download, [dl_id], [dl_file], api_name="download")
