"""The Gradio web app: new run, jobs, dashboard, model page — a thin layer over ``jobs.service``.

Named API endpoints (for ``gradio_client``): ``/submit``, ``/list_jobs``, ``/show_job``, ``/cancel_job``,
``/download``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gradio as gr
import yaml

from jobs.service import JobService, SubmitError

METHODS = ["none", "bias", "mask_tuning", "liar", "ls"]
# every registered criterion; their options go in the recipe YAML below the form
CRITERIA = ["magnitude", "flap", "snip", "kwon", "taylor", "kcm", "random"]
CRITERIA_INFO = (
    "magnitude · flap (activations) · snip, kwon, taylor (gradients of the calibration loss) · "
    "kcm (neurons only) · random; options: edit the recipe YAML"
)
NAMED_SETS = ["wikitext2", "c4", "alpaca"]
MAX_UPLOAD_MB = 50
TABLE_COLUMNS = [
    "id",
    "status",
    "stage",
    "layer",
    "progress",
    "elapsed",
    "user",
    "model",
    "ratio",
    "method",
    "criterion",
]


def _bar(fraction: float, width: int = 12) -> str:
    filled = round(max(0.0, min(1.0, fraction or 0.0)) * width)
    return "█" * filled + "░" * (width - filled) + f" {fraction * 100:3.0f}%"


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def job_rows(service: JobService, status: str | None = None) -> list[list[Any]]:
    rows = []
    for j in service.list(status=status or None, limit=200):
        layer = f"{j['layer']}/{j['n_layers']}" if j["n_layers"] else "–"
        rows.append(
            [
                j["id"],
                j["status"],
                j["stage"] or "–",
                layer,
                _bar(j["progress"] or 0.0),
                _elapsed(j["elapsed_s"]),
                j["submitted_by"] or "–",
                Path(str(j["model"])).name,
                j["ratio"],
                j["method"],
                j["criterion"],
            ]
        )
    return rows


def evaluations_for(evaluate: str | None, seq_len) -> list[dict[str, Any]]:
    if not evaluate or evaluate == "(none)":
        return []
    return [{"type": "perplexity", "dataset": str(evaluate), "seq_len": int(seq_len)}]


def describe_model(model: str | None) -> tuple[str | None, str]:
    """("decoder" | "encoder" | None, a one-line description) from a local model's config.json."""
    path = Path(str(model or "")).expanduser() / "config.json"
    if not path.is_file():
        return None, "hub id or unknown directory: checked when the job starts" if model else ""
    cfg = json.loads(path.read_text())
    mt = cfg.get("model_type", "?")
    kind = (
        "encoder"
        if mt in ("bert", "liar_bert")
        else "decoder"
        if mt in ("llama", "mistral", "qwen2", "liar_llama", "liar_mistral", "liar_qwen2")
        else None
    )
    if kind is None:
        return None, f"⚠ model type `{mt}` is not supported (LLaMA family or BERT family)"
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    return kind, (
        f"{kind} · `{mt}` · {cfg.get('num_hidden_layers')} layers · {heads} heads"
        f"{f' / {kv} key-value heads' if kv != heads else ''} · FFN {cfg.get('intermediate_size')}"
    )


ROUND_CHOICES = [1, 8, 16, 32, 64, 128]


def build_recipe(
    model, modules, ratio, allocation, round_neurons, criterion, damp, calibration, upload, samples, seq_len, seed
) -> dict[str, Any]:
    if not model or not str(model).strip():
        raise SubmitError("choose a model: a Hugging Face id or a local directory")
    source = upload if upload else calibration
    if not source:
        raise SubmitError("choose a calibration set or upload a .txt / .jsonl file")
    if upload:
        size = Path(upload).stat().st_size
        if size > MAX_UPLOAD_MB * 2**20:
            raise SubmitError(f"the uploaded file is {size / 2**20:.0f} MB; the limit is {MAX_UPLOAD_MB} MB")
    try:
        multiple = 1 if round_neurons in (None, "") else int(round_neurons)
    except (TypeError, ValueError):
        multiple = 0
    if multiple < 1:
        raise SubmitError(f"FFN width multiple must be a whole number ≥ 1, got {round_neurons!r}")
    rounding = {"round_to": {"neurons": multiple}} if multiple > 1 else {}
    return {
        "model": str(model).strip(),
        "modules": modules,
        "ratio": float(ratio),
        "allocation": allocation,
        **rounding,
        "criterion": {"name": criterion},
        "reconstruction": {"method": "liar", "damp": float(damp)},
        "calibration": {
            "dataset": str(source),
            "num_calibration_samples": int(samples),
            "max_seq_length": int(seq_len),
            "seed": int(seed),
        },
    }


def build_app(
    service: JobService | None = None,
    default_models: list[str] | None = None,
    default_texts: list[str] | None = None,
    eval_texts: list[str] | None = None,
) -> gr.Blocks:
    service = service or JobService()
    models = default_models or []
    texts = (default_texts or []) + NAMED_SETS
    eval_texts = eval_texts or []

    def _from_form(form: tuple) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        """(recipe, evaluations, methods) from the form values, validated; raises SubmitError."""
        *fields, evaluate, methods = form
        recipe = build_recipe(*fields)
        if not methods:
            raise SubmitError("pick at least one reconstruction method")
        evals = evaluations_for(evaluate, recipe["calibration"]["max_seq_length"])
        for m in methods:
            service.validate({**recipe, "reconstruction": {**recipe["reconstruction"], "method": m}}, evals)
        recipe["reconstruction"]["method"] = methods[0]
        return recipe, evals, list(methods)

    def validate(*form):
        try:
            recipe, _, _ = _from_form(form[:-1])
        except SubmitError as exc:
            return gr.update(value=f"**⚠ {exc}**", visible=True), "", None
        text = yaml.safe_dump(recipe, sort_keys=False)
        out = service.settings.data_dir / "recipes" / f"{abs(hash(text)) % 10**10}"
        out.mkdir(parents=True, exist_ok=True)
        path = out / "recipe.yaml"
        path.write_text(text)
        return gr.update(value="✓ valid", visible=True), text, str(path)

    def submit_yaml_text(text: str, evaluate, user, request: gr.Request | None = None):
        if request is not None and getattr(request, "username", None):
            user = request.username
        if not text or not text.strip():
            return gr.update(value="**⚠ the recipe box is empty: validate the form or paste a recipe**", visible=True)
        try:
            seq = (yaml.safe_load(text) or {}).get("calibration", {}).get("max_seq_length", 128)
            job_id = service.submit(text, submitted_by=user or None, evaluations=evaluations_for(evaluate, seq))
        except (SubmitError, RuntimeError, AttributeError, yaml.YAMLError) as exc:
            return gr.update(value=f"**⚠ {exc}**", visible=True)
        return gr.update(value=f"✓ submitted job {job_id}", visible=True)

    def on_model_change(name):
        kind, text = describe_model(name)
        if kind == "encoder":
            return text + " — perplexity does not apply", gr.update(value="(none)", interactive=False)
        return text, gr.update(interactive=True)

    def submit_form(*form, request: gr.Request | None = None):
        user = form[-1]
        if request is not None and getattr(request, "username", None):
            user = request.username  # with login on, the account is who submitted
        try:
            recipe, evals, methods = _from_form(form[:-1])
            if len(methods) == 1:
                ids = [service.submit(recipe, submitted_by=user or None, evaluations=evals)]
                msg = f"✓ submitted job {ids[0]}"
            else:
                group, ids = service.submit_sweep(recipe, methods=methods, submitted_by=user or None, evaluations=evals)
                msg = f"✓ submitted sweep {group}: jobs {', '.join(map(str, ids))}"
        except (SubmitError, RuntimeError) as exc:
            return gr.update(value=f"**⚠ {exc}**", visible=True)
        return gr.update(value=msg, visible=True)

    def api_submit(recipe_yaml: str, user: str = "", request: gr.Request = None) -> dict:
        """Submit a recipe given as YAML; returns {"id": N} or raises with the validation message."""
        if request is not None and getattr(request, "username", None):
            user = request.username  # with login on, the account is who submitted
        try:
            return {"id": service.submit(recipe_yaml, submitted_by=user or None)}
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

    def model_page(job_id):
        if not job_id:
            return "Pick a job id.", "", None, "", None, None
        try:
            info = service.show(int(job_id))
        except KeyError as exc:
            return f"**{exc.args[0]}**", "", None, "", None, None
        head = (
            f"### Job {info['id']} — {info['status']}\n\n`{info['model']}` · ratio {info['ratio']} · "
            f"{info['method']} · {info['criterion']} · by {info['submitted_by'] or '–'}"
        )
        if info["error"]:
            head += f"\n\n**Error:** {info['error']}"
        metrics = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted(info["metrics"].items()))
        if metrics:
            head += "\n\n| metric | value |\n|---|---|\n" + metrics
        report = [
            [r["layer"], r["module"], r["kept"], r["total"], round(r["error_before"], 4), round(r["error_after"], 4)]
            for r in info["report"] or []
        ]
        archive = next((a["path"] for a in info["artifacts"] if a["kind"] == "archive"), None)
        ckpt = next((a["path"] for a in info["artifacts"] if a["kind"] == "checkpoint"), None)
        card = Path(ckpt, "README.md").read_text() if ckpt and Path(ckpt, "README.md").exists() else ""
        if card.startswith("---"):  # drop the card's YAML front matter (hub metadata)
            card = card.split("---", 2)[-1].lstrip()
        snippet = (
            f"from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(\n"
            f'    "{ckpt}", trust_remote_code=True)'
            if ckpt
            else ""
        )
        import pandas as pd

        curve = pd.DataFrame(
            [
                {"projection": f"{r['layer']}.{r['module'][:4]}", "step": i, "error": r[key], "when": when}
                for i, r in enumerate(info["report"] or [])
                for key, when in (("error_before", "pruned"), ("error_after", "reconstructed"))
            ],
            columns=["projection", "step", "error", "when"],
        )
        return (
            head,
            yaml.safe_dump(info["recipe"], sort_keys=False),
            report,
            card + "\n\n```python\n" + snippet + "\n```" if snippet else card,
            archive,
            curve,
        )

    def dashboard(model, method, user, metric="perplexity", criterion=""):
        rows = []
        done = [j for j in service.list(limit=500) if j["status"] == "SUCCEEDED"]
        all_metrics = service.metrics([j["id"] for j in done])
        for j in done:
            if (
                (model and model not in str(j["model"]))
                or (method and j["method"] != method)
                or (criterion and j["criterion"] != criterion)
                or (user and j["submitted_by"] != user)
            ):
                continue
            m = all_metrics[j["id"]]
            rows.append(
                {
                    "id": j["id"],
                    "model": Path(str(j["model"])).name,
                    "method": j["method"],
                    "criterion": j["criterion"],
                    "ratio": j["ratio"],
                    "achieved": m.get("achieved_ratio"),
                    "perplexity": None if m.get("perplexity") is None else round(m["perplexity"], 3),
                    "params_after": m.get("params_after"),
                    "user": j["submitted_by"] or "–",
                }
            )
        import pandas as pd

        df = pd.DataFrame(
            rows,
            columns=["id", "model", "method", "criterion", "ratio", "achieved", "perplexity", "params_after", "user"],
        )
        plot_df = df.dropna(subset=[metric]).rename(columns={metric: "value"})
        title = f"{metric} vs ratio (per method)"
        return df, gr.update(value=plot_df, title=title), gr.update(value=plot_df, title=f"parameters kept vs {metric}")

    with gr.Blocks(title="LIAR — retraining-free pruning", analytics_enabled=False) as demo:
        gr.Markdown(
            "# LIAR · retraining-free structured pruning\nPrune heads and neurons, rebuild the "
            "pruned layers by least squares, download a loadable checkpoint."
        )
        with gr.Tab("New run"):
            with gr.Row():
                with gr.Column(scale=3):
                    model_info = gr.Markdown(describe_model(models[0])[1] if models else "", elem_id="model-info")
                    model = gr.Dropdown(
                        models,
                        value=models[0] if models else None,
                        allow_custom_value=True,
                        label="Model",
                        info="a bundled model, a Hugging Face id, or a local directory",
                    )
                    with gr.Row():
                        modules = gr.Radio(["both", "heads", "neurons"], value="both", label="Prune")
                        allocation = gr.Radio(["uniform", "global"], value="uniform", label="Allocation")
                        round_neurons = gr.Dropdown(
                            ROUND_CHOICES,
                            value=1,
                            label="FFN width multiple",
                            info="kept neurons per layer rounded to a multiple (64: faster kernels); 1 = exact",
                        )
                    ratio = gr.Slider(
                        0.05,
                        0.9,
                        value=0.2,
                        step=0.05,
                        label="Ratio",
                        info="fraction of the transformer blocks' parameters to remove",
                    )
                    with gr.Row():
                        criterion = gr.Dropdown(CRITERIA, value="magnitude", label="Criterion", info=CRITERIA_INFO)
                        methods = gr.CheckboxGroup(
                            METHODS, value=["liar"], label="Reconstruction", info="several → a side-by-side sweep"
                        )
                        damp = gr.Number(0.001, label="Damping", minimum=0)
                with gr.Column(scale=2):
                    calibration = gr.Dropdown(
                        texts,
                        value=texts[0] if texts else None,
                        allow_custom_value=True,
                        label="Calibration set",
                        info="named set, bundled text or a file path",
                    )
                    upload = gr.File(
                        label=f"…or upload .txt / .jsonl (≤ {MAX_UPLOAD_MB} MB)",
                        file_types=[".txt", ".jsonl"],
                        type="filepath",
                    )
                    with gr.Row():
                        samples = gr.Number(128, label="Samples", precision=0, minimum=1)
                        seq_len = gr.Number(128, label="Sequence length", precision=0, minimum=2)
                        seed = gr.Number(0, label="Seed", precision=0)
                    evaluate = gr.Dropdown(
                        ["(none)"] + eval_texts,
                        value=eval_texts[0] if eval_texts else "(none)",
                        allow_custom_value=True,
                        label="Perplexity on (held-out text)",
                        info="evaluated after pruning; decoders only",
                    )
                    user = gr.Textbox(label="Your name", value=os.environ.get("USER", ""))
            form = [
                model,
                modules,
                ratio,
                allocation,
                round_neurons,
                criterion,
                damp,
                calibration,
                upload,
                samples,
                seq_len,
                seed,
                evaluate,
            ]
            with gr.Row():
                check = gr.Button("Validate")
                submit = gr.Button("Submit", variant="primary")
            status = gr.Markdown(visible=False, elem_id="submit-status")
            with gr.Row():
                recipe_yaml = gr.Code(
                    label="Recipe (YAML) — edit or paste one, then submit it",
                    language="yaml",
                    interactive=True,
                    scale=4,
                )
                with gr.Column(scale=1):
                    submit_yaml = gr.Button("Submit this YAML")
                    recipe_file = gr.File(label="Download recipe", interactive=False, elem_id="recipe-file")
            check.click(validate, form + [methods, user], [status, recipe_yaml, recipe_file], api_name=False)
            submit_yaml.click(submit_yaml_text, [recipe_yaml, evaluate, user], [status], api_name=False)
            model.change(on_model_change, [model], [model_info, evaluate], api_name=False)
            submit.click(submit_form, form + [methods, user], [status], api_name=False)

        with gr.Tab("Jobs"):
            status_filter = gr.Dropdown(
                ["", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"], value="", label="Status"
            )
            table = gr.Dataframe(
                headers=TABLE_COLUMNS, value=lambda: job_rows(service), interactive=False, elem_id="jobs-table"
            )
            with gr.Row():
                job_pick = gr.Number(None, label="Job id", precision=0)
                cancel_btn = gr.Button("Cancel job", variant="stop")
                rerun_btn = gr.Button("Re-run")
            job_msg = gr.Markdown()
            log_tail = gr.Code(label="Log tail", language=None)
            timer = gr.Timer(2.0)
            timer.tick(lambda s: job_rows(service, s), [status_filter], [table], api_name=False)
            status_filter.change(lambda s: job_rows(service, s), [status_filter], [table], api_name=False)

            def do_cancel(job_id):
                try:
                    return f"job {int(job_id)}: {service.cancel(int(job_id))}"
                except (KeyError, TypeError) as exc:
                    return f"**⚠ {exc.args[0] if exc.args else 'pick a job id'}**"

            def do_rerun(job_id):
                try:
                    info = service.show(int(job_id))
                    new = service.submit(
                        info["recipe"], submitted_by=info["submitted_by"], evaluations=info["evaluations"]
                    )
                    return f"re-submitted job {int(job_id)} as job {new}"
                except (KeyError, TypeError, SubmitError) as exc:
                    return f"**⚠ {exc.args[0] if exc.args else 'pick a job id'}**"

            def do_log(job_id):
                try:
                    return "\n".join(
                        f"{x['at'][11:19]} {x['level']:7s} {x['message']}"
                        for x in service.show(int(job_id))["log"][-20:]
                    )
                except (KeyError, TypeError):
                    return ""

            cancel_btn.click(do_cancel, [job_pick], [job_msg], api_name=False)
            rerun_btn.click(do_rerun, [job_pick], [job_msg], api_name=False)
            job_pick.change(do_log, [job_pick], [log_tail], api_name=False)

        with gr.Tab("Dashboard"):
            with gr.Row():
                f_model = gr.Textbox(label="Model contains")
                f_method = gr.Dropdown([""] + METHODS, value="", label="Method")
                f_criterion = gr.Dropdown([""] + CRITERIA, value="", label="Criterion")
                f_user = gr.Textbox(label="User")
                f_metric = gr.Dropdown(["perplexity", "achieved", "params_after"], value="perplexity", label="Metric")
                refresh = gr.Button("Refresh")
            runs = gr.Dataframe(interactive=False, elem_id="runs-table")
            with gr.Row():
                ppl_plot = gr.LinePlot(
                    x="ratio", y="value", color="method", title="perplexity vs ratio", elem_id="ppl-plot"
                )
                size_plot = gr.ScatterPlot(
                    x="params_after", y="value", color="method", title="parameters kept vs perplexity"
                )
            filters = [f_model, f_method, f_user, f_metric, f_criterion]
            refresh.click(dashboard, filters, [runs, ppl_plot, size_plot], api_name=False)
            f_metric.change(dashboard, filters, [runs, ppl_plot, size_plot], api_name=False)
            demo.load(dashboard, filters, [runs, ppl_plot, size_plot], api_name=False)

        with gr.Tab("Model"):
            page_id = gr.Number(None, label="Job id", precision=0, elem_id="model-job-id")
            head = gr.Markdown()
            with gr.Row():
                page_recipe = gr.Code(label="Recipe", language="yaml")
                page_report = gr.Dataframe(
                    headers=["layer", "module", "kept", "of", "error before", "error after"],
                    label="Per-layer reconstruction error",
                    interactive=False,
                )
            error_plot = gr.LinePlot(
                x="step",
                y="error",
                color="when",
                title="relative output error per pruned projection (layer order)",
                elem_id="error-plot",
            )
            download = gr.DownloadButton("Download checkpoint (.tar.gz)")
            card = gr.Markdown()
            page_id.change(
                model_page, [page_id], [head, page_recipe, page_report, card, download, error_plot], api_name=False
            )

        gr.api(api_submit, api_name="submit")
        gr.api(api_list, api_name="list_jobs")
        gr.api(api_show, api_name="show_job")
        gr.api(api_cancel, api_name="cancel_job")
        with gr.Row(visible=False):
            dl_id = gr.Number(precision=0)
            dl_file = gr.File()
            gr.Button().click(api_download, [dl_id], [dl_file], api_name="download")
    return demo


def launch(host: str = "127.0.0.1", port: int = 7860, **kwargs) -> None:
    users = os.environ.get("LIAR_APP_USERS")  # "alice:pw1,bob:pw2" turns login on
    auth = [tuple(pair.split(":", 1)) for pair in users.split(",")] if users else None
    service = JobService()
    demo = build_app(service, **kwargs)
    print(f"LIAR app on http://{host}:{port}  (data: {service.settings.data_dir})", flush=True)
    # system fonts only: the default theme would fetch web fonts from the internet
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    demo.queue().launch(
        theme=theme,
        server_name=host,
        server_port=port,
        auth=auth,
        show_error=True,
        allowed_paths=[str(service.settings.artifacts_dir), str(service.settings.data_dir / "recipes")],
        quiet=True,
    )


if __name__ == "__main__":
    launch()
