"""The "New run" tab: the pruning form, its recipe as YAML, and submission (one job, or a sweep of one
job per ratio × reconstruction method)."""

from __future__ import annotations

import os

import gradio as gr

from app.web import forms
from app.web.auth import Login
from jobs.service import JobService


def _status(message: str):
    return gr.update(value=message, visible=True)


def _pruning_column(models: list[str]) -> dict:
    """Model, what to prune and how much, criterion and reconstruction."""
    c = {}
    c["model_info"] = gr.Markdown(forms.describe_model(models[0])[1] if models else "", elem_id="model-info")
    c["model"] = gr.Dropdown(
        models,
        value=models[0] if models else None,
        allow_custom_value=True,
        label="Model",
        info="a bundled model, a Hugging Face id, or a local directory",
    )
    with gr.Row():
        c["modules"] = gr.Radio(
            ["both", "heads", "neurons", "blocks"],
            value="both",
            label="Prune",
            info="blocks: whole transformer blocks only (depth pruning, stood in for by a least-squares map)",
        )
        c["allocation"] = gr.Radio(
            ["auto", "uniform", "global"],
            value="auto",
            label="Allocation",
            info="auto: what the criterion needs (global for obs, which criterion auto picks for decoders up to 50%); "
            "uniform: every layer loses the ratio, its heads half of it (head_ratio: auto); global: one ranking "
            "over all layers",
        )
        c["round_neurons"] = gr.Dropdown(
            forms.ROUND_CHOICES,
            value="auto",
            label="FFN width multiple",
            info="kept neurons per layer rounded to a multiple: auto = 128 on a GPU worker, 64 on a CPU "
            "(faster kernels); 1 = exact widths",
        )
        c["kv_groups"] = gr.Dropdown(
            forms.KV_GROUP_CHOICES,
            value=forms.KV_GROUP_CHOICES[0],
            label="Key/value groups",
            info="whole: drop query heads only in whole key/value groups (stock GQA layers, no gather); "
            "free: one at a time; auto = whole on a GPU worker (free for one key/value head, or a ratio "
            "whole groups cannot reach), free on a CPU",
        )
    c["ratio"] = gr.Textbox(
        "0.2",
        label="Ratio or speed-up",
        info="fraction of the transformer blocks' parameters to remove, strictly between 0 and 1; several "
        "(0.2, 0.3, 0.5) → a sweep: one job per ratio × method. Or a batch-1 decode speed-up such as 1.5x: "
        "the worker measures its own speed and keeps the blocks and widths that reach it with the least loss",
        elem_id="ratio",
    )
    with gr.Row():
        c["criterion"] = gr.Dropdown(forms.CRITERIA, value="auto", label="Criterion", info=forms.CRITERIA_INFO)
        c["methods"] = gr.CheckboxGroup(
            forms.METHODS, value=["ls"], label="Reconstruction", info="several → a sweep, side by side"
        )
        c["damp"] = gr.Number(0.001, label="Damping", minimum=0)
    return c


def _data_column(texts: list[str], eval_texts: list[str], named: bool) -> dict:
    """Calibration data, the held-out text to evaluate on, the serving files to write (folded away
    under "Output"), and who submits (a name box only when there is no login: ``named`` False)."""
    c = {}
    c["calibration"] = gr.Dropdown(
        texts,
        value=texts[0] if texts else None,
        allow_custom_value=True,
        label="Calibration set",
        info="named set, bundled text or a file path",
    )
    c["upload"] = gr.File(
        label=f"…or upload .txt / .jsonl (≤ {forms.MAX_UPLOAD_MB} MB)", file_types=[".txt", ".jsonl"], type="filepath"
    )
    with gr.Row():
        c["text_field"] = gr.Textbox(
            "text",
            label="Text field",
            info="a .jsonl record's text; two, comma-separated (premise, hypothesis), make an encoder's pair",
        )
        c["label_field"] = gr.Textbox(
            "",
            label="Label field",
            info="a .jsonl record's class label, for an encoder classifier: criterion auto then uses "
            "Kwon et al.'s Fisher on the labelled loss (empty: unlabelled)",
        )
    with gr.Row():
        c["samples"] = gr.Number(128, label="Samples", precision=0, minimum=1)
        c["seq_len"] = gr.Number(128, label="Sequence length", precision=0, minimum=2)
        c["seed"] = gr.Number(0, label="Seed", precision=0)
    c["evaluate"] = gr.Dropdown(
        [forms.NO_EVALUATION] + eval_texts,
        value=eval_texts[0] if eval_texts else forms.NO_EVALUATION,
        allow_custom_value=True,
        label="Perplexity on (held-out text)",
        info="evaluated after pruning; decoders only",
    )
    with gr.Row():
        c["tasks"] = gr.Textbox(
            "",
            label="lm-eval tasks",
            info="run after pruning, comma-separated (piqa, arc_easy, …: the registry's need the Hub); "
            "decoders only; block by block for models bigger than the GPU",
        )
        c["task_dir"] = gr.Textbox("", label="Task folder", info="local task YAMLs (optional), a server-side folder")
    with gr.Accordion("Output", open=False):
        c["export"] = gr.CheckboxGroup(
            forms.SERVING_FORMS, value=[], label="Serving files", info=forms.SERVING_INFO, elem_id="serving-files"
        )
    c["user"] = gr.Textbox(
        label="Your name", value=os.environ.get("USER", ""), info="recorded with the job", visible=not named
    )
    return c


# the inputs of forms.from_form, in its order (then the methods; the user comes last)
FORM_FIELDS = (*forms.RECIPE_FIELDS, "evaluate", "tasks", "task_dir")


def build(service: JobService, models: list[str], texts: list[str], eval_texts: list[str], login: Login) -> None:
    """The tab's components, inside the current ``gr.Tab``, and their events (``login``: who submits)."""
    with gr.Row():
        with gr.Column(scale=3):
            c = _pruning_column(models)
        with gr.Column(scale=2):
            c.update(_data_column(texts, eval_texts, login.required))
    with gr.Row():
        check = gr.Button("Validate")
        submit = gr.Button("Submit", variant="primary")
    status = gr.Markdown(visible=False, elem_id="submit-status")
    with gr.Row():
        recipe_yaml = gr.Code(
            label="Recipe (YAML) — edit or paste one, then submit it", language="yaml", interactive=True, scale=4
        )
        with gr.Column(scale=1):
            submit_yaml = gr.Button("Submit this YAML")
            recipe_file = gr.File(label="Download recipe", interactive=False, elem_id="recipe-file")

    def validate(*form):  # creates nothing: checked as for anyone (Submit checks the account's rights too)
        message, text, path = forms.validate_form(service, form[:-1])
        return _status(message), text, path

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
        return _status(forms.submit_form(service, form, forms.submitter(user, request), login.actor(request)))

    def submit_yaml_text(text: str, evaluate, tasks, task_dir, user, request: gr.Request | None = None):
        submitter = forms.submitter(user, request)
        return _status(forms.submit_yaml(service, text, evaluate, submitter, tasks, task_dir, login.actor(request)))

    def on_model_change(name):
        text, perplexity_applies = forms.model_hint(name, service.readable)
        if perplexity_applies:  # and lm-eval: both need a causal language model
            return text, gr.update(interactive=True), gr.update(interactive=True)
        return text, gr.update(value=forms.NO_EVALUATION, interactive=False), gr.update(value="", interactive=False)

    inputs = [c[name] for name in FORM_FIELDS] + [c["methods"], c["user"]]
    check.click(validate, inputs, [status, recipe_yaml, recipe_file], api_name=False)
    yaml_inputs = [recipe_yaml, c["evaluate"], c["tasks"], c["task_dir"], c["user"]]
    submit_yaml.click(submit_yaml_text, yaml_inputs, [status], api_name=False)
    c["model"].change(on_model_change, [c["model"]], [c["model_info"], c["evaluate"], c["tasks"]], api_name=False)
    submit.click(submit_form, inputs, [status], api_name=False)
