"""The Model page's "Serving forms" panel: which forms a finished job's checkpoint can take (GGUF f16 …
iq2_m for llama.cpp, vLLM's DeciLM form), why not where it cannot, a button that queues an
export-only job for the chosen ones (``jobs.export_jobs``), each export job's files with their
size and sha256, linked to the same download routes as a checkpoint's (``app.web.downloads``), and
the exports' held-out perplexity against their size (``app.web.export_chart``).

Also the named API endpoints ``/serving_forms`` (the forms and why not, as JSON) and ``/export_job``
(queue one; returns ``{"id": N}``), under the rules of a download (``jobs.access``)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from app.web import export_chart
from app.web.dashboard import vega
from app.web.downloads import file_url, tar_url
from app.web.forms import shown
from app.web.listings import size_text
from jobs import export_jobs
from jobs.access import OPEN, Actor, Forbidden, NotNow
from jobs.service import JobService

RESTRICTED = "Exports of this checkpoint are for the job's owner and the administrators."


def _files_table(job_id: int, files: list[dict[str, Any]]) -> str:
    rows = "\n".join(
        f"| [{f['name']}]({file_url(job_id, f['name'])}) | {size_text(f['size'])} | `{f['sha256'] or '–'}` |"
        for f in files
    )
    return f"| file | size | sha256 |\n|---|---:|---|\n{rows}"


def _state(choice: export_jobs.Choice) -> str:
    if choice.in_checkpoint:
        return "✓ already in the checkpoint (its recipe's `export`)"
    if choice.done_by is not None:
        return f"✓ exported by job {choice.done_by}"
    if choice.problem is not None:
        return f"✗ {choice.problem}"
    return "possible"


def _rows(choices: list[export_jobs.Choice]) -> list[str]:
    """The table's rows: one per form, but neighbouring forms refused for the same reason in one row (a
    tokenizer GGUF cannot hold refuses every GGUF type alike)."""
    groups: list[tuple[list[export_jobs.Choice], str]] = []
    for c in choices:
        state = _state(c)
        if groups and c.problem is not None and groups[-1][1] == state:
            groups[-1][0].append(c)
        else:
            groups.append(([c], state))
    rows = []
    for group, state in groups:
        label = group[0].label
        if len(group) > 1:
            kinds = [c.label.removeprefix("GGUF ").removesuffix(" (llama.cpp)") for c in group]
            gguf = all(c.label.startswith("GGUF ") for c in group)
            label = f"GGUF {', '.join(kinds)} (llama.cpp)" if gguf else " / ".join(c.label for c in group)
        rows.append(f"| {label} | {' '.join(f'`{c.form}`' for c in group)} | {state} |")
    return rows


def view(service: JobService, job_id: int | None, actor: Actor = OPEN) -> tuple[str, list[tuple[str, str]]]:
    """The panel's text for the job on the page, and the forms it lets one export now as (label,
    form), from one look at the checkpoint: nothing for no job, or one without a finished checkpoint
    of its own; the restriction's sentence where ``actor`` may not download it."""
    return panel(service, job_id, actor)[:2]


def panel(
    service: JobService, job_id: int | None, actor: Actor = OPEN
) -> tuple[str, list[tuple[str, str]], dict[str, Any] | None, str]:
    """:func:`view`'s text and forms, and the exports' chart (``app.web.export_chart``: its spec, None
    where the job has no export job, and its caption)."""
    if job_id is None:
        return "", [], None, ""
    try:
        choices = export_jobs.choices(service, job_id, actor)
    except Forbidden:
        return RESTRICTED, [], None, ""
    except (KeyError, NotNow):
        return "", [], None, ""
    lines = _rows(choices)
    text = "### Serving forms\n\n| form | name | can this checkpoint take it? |\n|---|---|---|\n" + "\n".join(lines)
    text += (
        "\n\nEach export is a job of its own on this checkpoint (nothing is pruned again); a quantized GGUF "
        "needs llama.cpp on the worker, which checks before writing anything."
    )
    exports = export_jobs.listing(service, job_id, actor)
    for j in exports:
        head = f"#### Export job {j['id']} — {', '.join(j['forms'])} · {j['status']} · by {j['by'] or '–'}"
        body = f"**Error:** {j['error']}" if j["error"] else ""
        if j["files"]:
            whole = f"[⬇ all of it as one file — liar-job-{j['id']}.tar]({tar_url(j['id'])})"
            body = f"{whole}\n\n{_files_table(j['id'], j['files'])}"
        text += f"\n\n{head}" + (f"\n\n{body}" if body else "")
    chart, caption = export_chart.view(service, job_id, exports)
    return text, [(c.label, c.form) for c in choices if c.offered], chart, caption


def markdown(service: JobService, job_id: int | None, actor: Actor = OPEN) -> str:
    """The panel's text (:func:`view`)."""
    return view(service, job_id, actor)[0]


def start(service: JobService, job_id: int | None, forms: list[str] | None, actor: Actor = OPEN) -> str:
    """Queue the export job for the chosen forms; the status line (the refusal's sentence on failure)."""
    from app.web.views import _refusal

    if job_id is None:
        return shown("pick a job first")
    if not forms:
        return shown("tick the serving forms to export first")
    try:
        new = export_jobs.submit(service, job_id, forms, actor)
    except Exception as exc:
        return _refusal(exc, f"export job {job_id}")
    return f"queued export job {new}: {', '.join(forms)} from job {job_id}'s checkpoint (it appears below)"


def build(service: JobService, login, page_id) -> None:
    """The panel on the Model page, refreshed whenever the page's job changes, and its API endpoints."""
    from app.web.views import job_id_of

    text_box = gr.Markdown(elem_id="model-exports")
    chart = gr.Plot(show_label=False, visible=False, elem_id="export-quality")
    caption = gr.Markdown(elem_id="export-quality-caption")
    with gr.Row():
        forms = gr.CheckboxGroup([], label="Export as", elem_id="export-forms", scale=3)
        button = gr.Button("Export", elem_id="export-button", scale=1)
    with gr.Row():
        status = gr.Markdown(elem_id="export-status")
        again = gr.Button("↻ Refresh the exports", size="sm", scale=0, visible=False, elem_id="export-refresh")

    def show(job_id, request: gr.Request = None):
        text, choices, spec, said = panel(service, job_id_of(job_id), login.actor(request))
        return (
            text,
            gr.update(value=vega(spec), visible=spec is not None),
            said,
            gr.CheckboxGroup(choices, value=[], visible=bool(choices)),
            gr.Button(visible=bool(choices)),
            gr.Button(visible=bool(text) and text != RESTRICTED),
            "",
        )

    def export(job_id, chosen, request: gr.Request = None):
        said = start(service, job_id_of(job_id), chosen, login.actor(request))
        return (*show(job_id, request)[:6], said)

    outputs = [text_box, chart, caption, forms, button, again, status]
    page_id.change(show, [page_id], outputs, api_name=False)
    button.click(export, [page_id, forms], outputs, api_name=False)
    again.click(show, [page_id], outputs, api_name=False)  # an export job's progress
    api(service, login)


def api(service: JobService, login) -> None:
    """The named endpoints ``/serving_forms`` and ``/export_job`` (``app.web.api``'s conventions)."""
    from app.web.api import answered

    @answered
    def api_serving_forms(job_id: float, request: gr.Request = None) -> str:
        """The serving forms of a finished job's checkpoint as a JSON list: ``form``, ``label``,
        ``possible``, ``problem`` (why not, one sentence), ``done_by`` (the export job that has it),
        ``in_checkpoint``; and ``exports``, the export jobs with their files."""
        actor = login.actor(request)
        forms = [
            {
                "form": c.form,
                "label": c.label,
                "possible": c.problem is None,
                "problem": c.problem,
                "done_by": c.done_by,
                "in_checkpoint": c.in_checkpoint,
            }  # fmt: skip
            for c in export_jobs.choices(service, int(job_id), actor)
        ]
        exports = export_jobs.listing(service, int(job_id), actor)
        for j in exports:
            for f in j["files"] or []:
                f["url"] = file_url(j["id"], f["name"])
        return json.dumps({"job": int(job_id), "forms": forms, "exports": exports})

    @answered
    def api_export_job(job_id: float, forms: str, request: gr.Request = None) -> dict:
        """Queue an export-only job writing ``forms`` (comma-separated: gguf-f16, gguf-q8_0, gguf-q4_k_m,
        vllm) from a finished job's checkpoint, as a job of the caller; returns {"id": N}. A form the
        checkpoint cannot take is refused, saying why, and nothing is created."""
        return {"id": export_jobs.submit(service, int(job_id), forms, login.actor(request))}

    gr.api(api_serving_forms, api_name="serving_forms")
    gr.api(api_export_job, api_name="export_job")
