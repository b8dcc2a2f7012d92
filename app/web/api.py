"""The named API endpoints, for ``gradio_client``: ``/submit``, ``/list_jobs``, ``/show_job``,
``/cancel_job``, ``/rerun_job``, ``/reevaluate_job``, ``/delete_job``, ``/download`` (the list of a
job's files and their URLs: the files themselves are served by ``app.web.downloads``, not through
Gradio, which would copy them first). The Model page's modules add ``/generate`` (``app.web.try_model``),
``/serving_forms`` and ``/export_job`` (``app.web.exports_panel``).

With login on, each call acts as the logged-in account (``app.web.auth``): the rules of
``jobs.access`` apply as in the UI. A refusal or a failure is a ``gradio.Error`` of one sentence,
with no server internals (:func:`answered`)."""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

import gradio as gr

from app.web import forms, listings
from app.web.auth import Login
from jobs.access import public_error
from jobs.service import JobService, QueueError

# what a refusal raises: its message is already the sentence users read
SAID = (ValueError, PermissionError, QueueError)
logger = logging.getLogger("liar.refusals")


def answered(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with every failure as a ``gradio.Error`` users can read: an unknown job
    (``KeyError``), a refusal (:data:`SAID`) as its sentence, logged as one line
    (:func:`log_refusal`), anything else as ``jobs.access.public_error`` (the detail in the server
    log under an error id). Gradio prints no traceback for any of them."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except KeyError as exc:
            message = str(exc.args[0]) if exc.args else "not found"
        except SAID as exc:
            message = str(exc)
        except Exception as exc:
            raise gr.Error(public_error(exc, f"API {fn.__name__}"), print_exception=False) from None
        log_refusal(fn.__name__.removeprefix("api_"), signature.bind_partial(*args, **kwargs).arguments, message)
        raise gr.Error(message, print_exception=False)

    return call


def log_refusal(action: str, arguments: dict[str, Any], message: str) -> None:
    """One line in the server log for a refused API call: who, what, which job, and why."""
    request = arguments.get("request")
    user = getattr(request, "username", None) or arguments.get("user") or "anonymous"
    try:
        where = f" job {int(arguments['job_id'])}"
    except (KeyError, TypeError, ValueError, OverflowError):  # an action on no job, or no number
        where = ""
    logger.info("refused: %s %s%s: %s", user, action, where, message)


def build(service: JobService, login: Login) -> None:
    """Register the endpoints on the current ``gr.Blocks``."""

    @answered
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
        ``user``: who submits, without a login (with one, the account); ``ppl``: evaluate perplexity
        after pruning on this named set or text file (in the server's data folders), over
        ``ppl_seq_len``-token windows (0: 512, or the model's positions if fewer); ``tasks``: lm-eval
        tasks to run after pruning (comma-separated; local YAMLs in ``task_dir``, one of the
        server's task folders)."""
        evaluations = forms.api_evaluations(recipe_yaml, ppl, ppl_seq_len, service.names.path)
        evaluations += forms.task_evaluation(tasks, task_dir)
        submitter = forms.submitter(user, request)
        actor = login.actor(request)
        job_id = service.submit(recipe_yaml, submitted_by=submitter, evaluations=evaluations, confine=True, actor=actor)
        return {"id": job_id}

    # list/show return JSON text: a JSON output holding file paths makes gradio_client try to fetch them
    @answered
    def api_list(status: str = "") -> str:
        """Recent jobs as a JSON list (id, status, stage, layer, n_layers, progress, model, ratio, …)."""
        return json.dumps(service.list(status=status or None))

    @answered
    def api_show(job_id: float, request: gr.Request = None) -> str:
        """One job as a JSON object: status, progress, recipe, metrics, files, per-layer report, log."""
        return json.dumps(service.show(int(job_id)))

    @answered
    def api_cancel(job_id: float, request: gr.Request = None) -> str:
        """Cancel a job (its owner or an admin); returns its status: CANCELLED, or RUNNING while a
        running job finishes its layer, or the status of a job that had finished."""
        return service.cancel(int(job_id), login.actor(request))

    @answered
    def api_rerun(job_id: float, request: gr.Request = None) -> dict:
        """Submit a job's recipe again as a new job of the caller (the job's owner or an admin);
        returns {"id": N}."""
        return {"id": service.rerun(int(job_id), login.actor(request))}

    @answered
    def api_reevaluate(job_id: float, evaluations: str = "", request: gr.Request = None) -> dict:
        """Run a succeeded job's evaluations again on its checkpoint, without pruning, as a new job of
        the caller (the job's owner or an admin) whose numbers complete the job's metrics; returns
        {"id": N}. ``evaluations``: "" the ones that failed (all if none did), "all", or their
        numbers as the job's log gives them ("1,3")."""
        return {"id": service.reevaluate(int(job_id), login.actor(request), evaluations or None)}

    @answered
    def api_delete(job_id: float, request: gr.Request = None) -> str:
        """Delete a finished job with its files (its owner or an admin)."""
        service.delete(int(job_id), login.actor(request))
        return f"deleted job {int(job_id)}"

    @answered
    def api_download(job_id: float, request: gr.Request = None) -> str:
        """What the job offers for download, as a JSON object: ``files`` (name, size, sha256, kind and
        ``url``) and ``checkpoint_tar`` (the whole checkpoint as one uncompressed tar); the URLs are
        relative to the app's address (plain HTTP GETs, with the login's cookie when login is on)."""
        return json.dumps(listings.download_listing(service, int(job_id), login.actor(request)))

    gr.api(api_submit, api_name="submit")
    gr.api(api_list, api_name="list_jobs")
    gr.api(api_show, api_name="show_job")
    gr.api(api_cancel, api_name="cancel_job")
    gr.api(api_rerun, api_name="rerun_job")
    gr.api(api_reevaluate, api_name="reevaluate_job")
    gr.api(api_delete, api_name="delete_job")
    gr.api(api_download, api_name="download")
