"""The named API endpoints, for ``gradio_client``: ``/submit``, ``/list_jobs``, ``/show_job``,
``/cancel_job``, ``/download`` (the list of a job's files and their URLs: the files themselves are
served by ``app.web.downloads``, not through Gradio, which would copy them first)."""

from __future__ import annotations

import json

import gradio as gr

from app.web import forms, listings
from jobs.service import JobService, SubmitError


def build(service: JobService) -> None:
    """Register the endpoints on the current ``gr.Blocks``."""

    def api_submit(
        recipe_yaml: str,
        user: str = "",
        ppl: str = "",
        ppl_seq_len: int = 0,
        tasks: str = "",
        task_dir: str = "",
        request: gr.Request = None,
    ) -> dict:
        """Submit a recipe given as YAML; returns {"id": N} or raises with the validation message.
        ``ppl``: evaluate perplexity after pruning on this named set or text file (in the server's data
        folders), over ``ppl_seq_len``-token windows (0: 512, or the model's positions if fewer);
        ``tasks``: lm-eval tasks to run after pruning (comma-separated; local YAMLs in ``task_dir``)."""
        try:
            evaluations = forms.api_evaluations(recipe_yaml, ppl, ppl_seq_len) + forms.task_evaluation(tasks, task_dir)
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
        """What the job offers for download, as a JSON object: ``files`` (name, size, sha256, kind and
        ``url``) and ``checkpoint_tar`` (the whole checkpoint as one uncompressed tar); the URLs are
        relative to the app's address (plain HTTP GETs, with the login's cookie when login is on)."""
        try:
            return json.dumps(listings.download_listing(service, int(job_id)))
        except KeyError as exc:
            raise gr.Error(str(exc.args[0])) from None

    gr.api(api_submit, api_name="submit")
    gr.api(api_list, api_name="list_jobs")
    gr.api(api_show, api_name="show_job")
    gr.api(api_cancel, api_name="cancel_job")
    gr.api(api_download, api_name="download")
