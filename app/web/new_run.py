"""The "New run" tab: the four choices a run needs first (model, ratio or speed-up, criterion,
calibration set), everything else under "Advanced" (its current values in its title), the recipe as
YAML, and submission (one job, or a sweep of one job per ratio × reconstruction method).

A bad box gets its sentence in place, under the box (:mod:`app.web.fields`), and keeps it until
the box is fixed: while a message shows, every change validates the form again.
"""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from app.web import forms, preview, recipe_box
from app.web.auth import Login
from core.models import bundled
from jobs.service import JobService

# the one-line help under each box; a box's error replaces it until the box is fixed
INFO = {
    "model": "a bundled model, a Hugging Face id, or a folder on the server",
    "ratio": "share of the blocks' parameters to remove (0.2, or 0.2, 0.3 for a sweep), or a decode speed-up: 1.5x",
    "criterion": forms.CRITERION_LINE,
    "calibration": "a bundled text, a named set, or a file on the server",
    "user": "recorded with the job",
    "modules": "blocks: whole transformer blocks (depth pruning)",
    "allocation": "auto: what the criterion needs; global: one ranking over all layers",
    "round_neurons": "kept FFN neurons rounded to a multiple (auto: 128 on a GPU, 64 on a CPU; k-quant rows: "
    "neurons in 256s and query heads × head_dim in 256s, so llama.cpp's q*_k_m keeps every pruned row on its type)",
    "kv_groups": "whole: drop query heads in whole key/value groups (auto: whole on a GPU)",
    "methods": "several → a sweep, side by side",
    "damp": "ridge term of the least-squares refit, relative to the mean diagonal",
    "text_field": "a .jsonl record's text (two, comma-separated, for a sentence pair)",
    "label_field": "a .jsonl record's class label (encoder classifiers)",
    "samples": "calibration sequences",
    "seq_len": "tokens per calibration sequence",
    "seed": "which calibration sequences are drawn",
    "evaluate": "held-out text, evaluated after pruning (decoders)",
    "tasks": "comma-separated, e.g. piqa, arc_easy (decoders)",
    "task_dir": "a server folder of task YAMLs (optional)",
    "export": forms.SERVING_INFO,
}
SLOTS = ("upload", "recipe")  # boxes without a help line: their message goes in a line below them
FIELDS = (*INFO, *SLOTS)
ERROR_CLASS = "field-error"


def model_line(name: str | None, readable=None, local=lambda name: name) -> tuple[str, bool]:
    """The line above the model picker and whether perplexity applies (``forms.model_hint``), or the
    sentence of a bundled model still being prepared, or whose preparation failed (``core.models.bundled``);
    ``local``: the folder a model's name stands for (``jobs.names``)."""
    note = bundled.status(local(name)) if name else None
    return (note, True) if note else forms.model_hint(local(name), readable)


def _first_screen(models: list[str], texts: list[str], named: bool, local) -> dict:
    """The four choices, the upload that can replace the calibration set, and (without login) a name;
    ``local``: the folder a model's name stands for (``jobs.names``)."""
    c = {}
    c["model_info"] = gr.Markdown(model_line(models[0], None, local)[0] if models else "", elem_id="model-info")
    with gr.Row():
        c["model"] = gr.Dropdown(
            models, value=models[0] if models else None, allow_custom_value=True, label="Model", info=INFO["model"]
        )
        c["ratio"] = gr.Textbox("0.2", label="Ratio or speed-up", info=INFO["ratio"], elem_id="ratio")
    with gr.Row():
        c["criterion"] = gr.Dropdown(forms.CRITERIA, value="auto", label="Criterion", info=INFO["criterion"])
        with gr.Column():
            c["calibration"] = gr.Dropdown(
                texts,
                value=texts[0] if texts else None,
                allow_custom_value=True,
                label="Calibration set",
                info=INFO["calibration"],
                elem_id="calibration",
            )
            c["upload"] = gr.File(
                label=f"…or upload .txt / .jsonl (≤ {forms.MAX_UPLOAD_MB} MB)",
                file_types=[".txt", ".jsonl"],
                type="filepath",
                height=120,
                elem_id="upload",
            )
            c["upload_error"] = gr.Markdown(visible=False, elem_id="upload-error", elem_classes=[ERROR_CLASS])
    c["user"] = gr.Textbox(label="Your name", value=os.environ.get("USER", ""), info=INFO["user"], visible=not named)
    return c


def _advanced(eval_texts: list[str]) -> dict:
    """The expert knobs, inside the "Advanced" accordion, by what they are about."""
    c = {}
    gr.Markdown("**Pruning**")
    with gr.Row():
        c["modules"] = gr.Radio(
            ["both", "heads", "neurons", "blocks"], value="both", label="Prune", info=INFO["modules"]
        )
        c["allocation"] = gr.Radio(
            ["auto", "uniform", "global"], value="auto", label="Allocation", info=INFO["allocation"]
        )
        c["methods"] = gr.CheckboxGroup(forms.METHODS, value=["ls"], label="Reconstruction", info=INFO["methods"])
    with gr.Row():
        c["round_neurons"] = gr.Dropdown(
            forms.ROUND_CHOICES, value="auto", label="FFN width multiple", info=INFO["round_neurons"]
        )
        c["kv_groups"] = gr.Dropdown(
            forms.KV_GROUP_CHOICES, value=forms.KV_GROUP_CHOICES[0], label="Key/value groups", info=INFO["kv_groups"]
        )
        c["damp"] = gr.Number(0.001, label="Damping", info=INFO["damp"])
    gr.Markdown("**Calibration**")
    with gr.Row():  # no minimum on the number boxes: the form says what is wrong, in place
        c["samples"] = gr.Number(128, label="Samples", precision=0, info=INFO["samples"])
        c["seq_len"] = gr.Number(128, label="Sequence length", precision=0, info=INFO["seq_len"])
        c["seed"] = gr.Number(0, label="Seed", precision=0, info=INFO["seed"])
    with gr.Row():
        c["text_field"] = gr.Textbox("text", label="Text field", info=INFO["text_field"])
        c["label_field"] = gr.Textbox("", label="Label field", info=INFO["label_field"])
    gr.Markdown("**Evaluation and output**")
    with gr.Row():
        c["evaluate"] = gr.Dropdown(
            [forms.NO_EVALUATION] + eval_texts,
            value=eval_texts[0] if eval_texts else forms.NO_EVALUATION,
            allow_custom_value=True,
            label="Perplexity on",
            info=INFO["evaluate"],
        )
        c["tasks"] = gr.Textbox("", label="lm-eval tasks", info=INFO["tasks"], elem_id="tasks")
        c["task_dir"] = gr.Textbox("", label="Task folder", info=INFO["task_dir"])
    c["export"] = gr.CheckboxGroup(
        forms.SERVING_FORMS, value=[], label="Serving files", info=INFO["export"], elem_id="serving-files"
    )
    return c


# the inputs of forms.from_form, in its order (then the methods; the user comes last)
FORM_FIELDS = (*forms.RECIPE_FIELDS, "evaluate", "tasks", "task_dir")
SUMMARY_FIELDS = ("modules", "allocation", "methods", "damp", "samples", "seq_len", "evaluate", "tasks", "export")


def _marks(c: dict, field: str | None, message: str = "", open_advanced: bool = False) -> list:
    """Updates of every box (the help line back, or ``message`` under ``field``), then the upload's
    and the recipe box's message lines, then the Advanced accordion (opened when the box is in it)."""
    out = []
    for name in INFO:
        bad = name == field
        out.append(gr.update(info=f"⚠ {message}" if bad else INFO[name], elem_classes=[ERROR_CLASS] if bad else []))
    for name in SLOTS:
        out.append(gr.update(value=f"⚠ {message}" if name == field else "", visible=name == field))
    out.append(gr.update(open=True) if open_advanced else gr.update())
    return out


def build(
    demo: gr.Blocks, service: JobService, models: list[str], texts: list[str], eval_texts: list[str], login: Login
) -> None:
    """The tab's components, inside the current ``gr.Tab`` of ``demo``, and their events (``login``: who
    submits)."""
    c = _first_screen(models, texts, login.required, service.names.path)
    c["estimate"] = gr.Markdown(elem_id="estimate")
    with gr.Row():
        check = gr.Button("Validate")
        submit = gr.Button("Submit", variant="primary")
    status = gr.Markdown(visible=False, elem_id="submit-status")
    with gr.Accordion("Advanced", open=False, elem_id="advanced") as advanced:
        c.update(_advanced(eval_texts))
    advanced.label = preview.advanced_title({n: c[n].value for n in SUMMARY_FIELDS})  # its current values
    with gr.Accordion("Recipe as YAML", open=False, elem_id="recipe") as recipe_panel:
        with gr.Row():
            c["recipe"] = gr.Code(
                label="Recipe (YAML): what Validate checked; edit or paste one, or a sweep grid, and submit it",
                language="yaml",
                interactive=True,
                scale=4,
            )
            with gr.Column(scale=1):
                submit_yaml = gr.Button("Submit this YAML")
                recipe_file = gr.File(label="Download recipe", interactive=False, elem_id="recipe-file")
        c["recipe_error"] = gr.Markdown(visible=False, elem_id="recipe-error", elem_classes=[ERROR_CLASS])
    _wire(service, c, login, advanced, recipe_panel, status, (check, submit, submit_yaml, recipe_file))
    _wire_hints(demo, service, c, advanced)


def _wire(service: JobService, c: dict, login: Login, advanced, recipe_panel, status, buttons) -> None:
    check, submit, submit_yaml, recipe_file = buttons
    inputs = [c[name] for name in FORM_FIELDS] + [c["methods"], c["user"]]
    marked = [c[n] for n in INFO] + [c["upload_error"], c["recipe_error"], advanced]
    in_advanced = set(SUMMARY_FIELDS) | {"round_neurons", "kv_groups", "text_field", "label_field", "seed", "task_dir"}
    showing = gr.State(None)  # the box whose message shows, if any

    def outcome(line) -> tuple:
        field, message = getattr(line, "field", None), getattr(line, "message", "")
        return (gr.update(value=line, visible=True), field, *_marks(c, field, message, field in in_advanced))

    def validate(*form):  # creates nothing: checked as for anyone (Submit checks the account's rights too)
        line, text, path = forms.validate_form(service, form[:-1])
        return (*outcome(line), text, path, gr.update(open=True) if text else gr.update())

    # Named parameters, not *form: Gradio fills a gr.Request argument only in a function whose
    # parameters it can count (with *args the logged-in user was silently dropped).
    def submit_form(
        model,
        modules,
        ratio,
        allocation,
        round_neurons,
        kv_groups,
        criterion,
        damp,
        calibration,
        upload,
        text_field,
        label_field,
        samples,
        seq_len,
        seed,
        export,
        evaluate,
        tasks,
        task_dir,
        methods,
        user,
        request: gr.Request = None,
    ):
        form = (model, modules, ratio, allocation, round_neurons, kv_groups, criterion, damp, calibration, upload)
        form += (text_field, label_field, samples, seq_len, seed, export, evaluate, tasks, task_dir, methods)
        actor, user = login.actor(request), forms.submitter(user, request)
        return outcome(forms.submit_form(service, form, user, actor))

    def submit_yaml_text(text, evaluate, tasks, task_dir, user, request: gr.Request = None):
        actor, user = login.actor(request), forms.submitter(user, request)
        return outcome(recipe_box.submit(service, text, evaluate, user, tasks, task_dir, actor))

    def recheck(field, *form):  # while a message shows: is it fixed yet?
        if field is None:
            return (gr.skip(),) * (2 + len(marked))
        line = forms.check_form(service, form[:-1])
        if line:
            return outcome(line)
        return (gr.update(value="✓ fixed: the form is valid", visible=True), None, *_marks(c, None))

    # The events that write the status line run one at a time, in the order they were sent: a box's
    # recheck sent before Submit must not land after Submit's answer and replace it (seen under load:
    # a stale "✓ fixed" over "ratio 1.5 must lie …"). Each is a check of the form, well under a second.
    ordered = {"api_name": False, "concurrency_id": "new-run-status", "concurrency_limit": 1}
    outputs = [status, showing, *marked]
    check.click(validate, inputs, [*outputs, c["recipe"], recipe_file, recipe_panel], **ordered)
    submit.click(submit_form, inputs, outputs, **ordered)
    yaml_inputs = [c["recipe"], c["evaluate"], c["tasks"], c["task_dir"], c["user"]]
    submit_yaml.click(submit_yaml_text, yaml_inputs, outputs, **ordered)
    for name in (*FORM_FIELDS, "methods"):
        event = c[name].blur if isinstance(c[name], (gr.Textbox, gr.Number)) else c[name].change
        event(recheck, [showing, *inputs], outputs, trigger_mode="always_last", **ordered)


def _wire_hints(demo: gr.Blocks, service: JobService, c: dict, advanced) -> None:
    """The model's description, the upload replacing the calibration set, the Advanced title and the
    estimate, each following the boxes they depend on."""

    def on_model_change(name):
        text, perplexity_applies = model_line(name, service.readable, service.names.path)
        if perplexity_applies:  # and lm-eval: both need a causal language model
            return text, gr.update(interactive=True), gr.update(interactive=True)
        return text, gr.update(value=forms.NO_EVALUATION, interactive=False), gr.update(value="", interactive=False)

    c["model"].change(on_model_change, [c["model"]], [c["model_info"], c["evaluate"], c["tasks"]], api_name=False)
    # again at each page load: a bundled model still being prepared at start says so until it is ready
    demo.load(on_model_change, [c["model"]], [c["model_info"], c["evaluate"], c["tasks"]], api_name=False)

    chosen = gr.State(c["calibration"].value)  # the set the upload replaced, back when it is removed

    def on_upload(path, current):
        label = f"Calibration set: the uploaded {Path(path).name} replaces it (remove the file to choose again)"
        return gr.update(value=f"⬆ {Path(path).name}", interactive=False, label=label), current

    def on_clear(previous):
        return gr.update(value=previous, interactive=True, label="Calibration set"), previous

    c["upload"].upload(on_upload, [c["upload"], c["calibration"]], [c["calibration"], chosen], api_name=False)
    c["upload"].clear(on_clear, [chosen], [c["calibration"], chosen], api_name=False)

    summary = [c[n] for n in SUMMARY_FIELDS]

    def retitle(*values):
        return gr.update(label=preview.advanced_title(dict(zip(SUMMARY_FIELDS, values, strict=True))))

    for box in summary:
        box.change(retitle, summary, [advanced], api_name=False, show_progress="hidden")

    def estimate(*form):
        return preview.estimate_line(service, form)

    inputs = [c[name] for name in FORM_FIELDS] + [c["methods"]]
    demo.load(estimate, inputs, [c["estimate"]], api_name=False, show_progress="hidden")
    for name in ("model", "ratio", "modules", "criterion", "samples", "seq_len", "allocation"):
        c[name].change(
            estimate, inputs, [c["estimate"]], api_name=False, show_progress="hidden", trigger_mode="always_last"
        )
