"""What the web app's tabs do, as plain functions of a :class:`JobService` and plain values (no Gradio).

The tab modules build the components and turn these return values into Gradio updates; everything a
test needs to check (the recipe a form makes, the messages it shows, the rows of a table) lives here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from app.web import listings
from core.models.liar_families import family_of, supported_families_text, unsupported_reason
from core.spec.criteria import CRITERIA as _CRITERIA
from core.spec.recipe import METHODS as _METHODS
from core.spec.recipe import NAMED_DATASETS, Recipe
from jobs.service import JobService, SubmitError

METHODS = list(_METHODS)
# every registered criterion; their options go in the recipe YAML below the form
CRITERIA = list(_CRITERIA)
CRITERIA_INFO = (
    "magnitude · flap (activations) · snip, kwon, taylor (gradients of the calibration loss) · "
    "kcm (neurons only) · random; options: edit the recipe YAML"
)
NAMED_SETS = list(NAMED_DATASETS)
MAX_UPLOAD_MB = 50
ROUND_CHOICES = ["auto", 1, 8, 16, 32, 64, 128]
NO_EVALUATION = "(none)"
STATUSES = ["", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]
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
RUN_COLUMNS = ["id", "model", "method", "criterion", "ratio", "achieved", "perplexity", "params_after", "user"]
DASHBOARD_METRICS = ["perplexity", "achieved", "params_after"]
REPORT_HEADERS = ["layer", "module", "kept", "of", "error before", "error after"]


# --- small formatters ----------------------------------------------------------------------------


def bar(fraction: float, width: int = 12) -> str:
    """A text progress bar: ``███░░░  50%``."""
    filled = round(max(0.0, min(1.0, fraction or 0.0)) * width)
    return "█" * filled + "░" * (width - filled) + f" {fraction * 100:3.0f}%"


def elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def shown(message: str) -> str:
    """An error message as the status line shows it."""
    return f"**⚠ {message}**"


def submitter(user: str | None, request: Any = None) -> str | None:
    """Who submits: with login on, the account (``request.username``); else the name typed in the form."""
    if request is not None and getattr(request, "username", None):
        return request.username
    return user or None


# --- the New-run form ----------------------------------------------------------------------------


def evaluations_for(evaluate: str | None, seq_len) -> list[dict[str, Any]]:
    """The job's evaluations for the "Perplexity on" choice: none, or perplexity on that text."""
    if not evaluate or evaluate == NO_EVALUATION:
        return []
    return [{"type": "perplexity", "dataset": str(evaluate), "seq_len": int(seq_len)}]


def describe_model(model: str | None) -> tuple[str | None, str]:
    """("decoder" | "encoder" | None, a one-line description) from a local model's config.json."""
    path = Path(str(model or "")).expanduser() / "config.json"
    if not path.is_file():
        if not model:
            return None, f"Supported families: {supported_families_text()}"
        return None, "hub id or unknown directory: checked when the job starts"
    cfg = json.loads(path.read_text())
    mt = cfg.get("model_type", "?")
    family = family_of(mt)
    if family is None:
        return None, f"⚠ {unsupported_reason(mt)}"
    kind = family.kind
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    return kind, (
        f"{kind} · `{mt}` · {cfg.get('num_hidden_layers')} layers · {heads} heads"
        f"{f' / {kv} key-value heads' if kv != heads else ''} · FFN {cfg.get(family.ffn_width_key)}"
    )


def model_hint(model: str | None) -> tuple[str, bool]:
    """(the line above the model picker, whether perplexity applies): not to encoders."""
    kind, text = describe_model(model)
    if kind == "encoder":
        return text + " — perplexity does not apply", False
    return text, True


def build_recipe(
    model, modules, ratio, allocation, round_neurons, criterion, damp, calibration, upload, samples, seq_len, seed
) -> dict[str, Any]:
    """The recipe dict of the form's fields (not yet validated by the recipe schema); raises SubmitError."""
    if not model or not str(model).strip():
        raise SubmitError("choose a model: a Hugging Face id or a local directory")
    source = upload if upload else calibration
    if not source:
        raise SubmitError("choose a calibration set or upload a .txt / .jsonl file")
    if round_neurons in (None, "", "auto"):
        multiple: int | str = "auto"
    else:
        try:
            multiple = int(round_neurons)
        except (TypeError, ValueError):
            multiple = 0
        if multiple < 1:
            raise SubmitError(f"FFN width multiple must be auto or a whole number ≥ 1, got {round_neurons!r}")
    rounding = {} if multiple == "auto" else {"round_to": {"neurons": multiple}}
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


def store_upload(service: JobService, upload: str | None) -> str | None:
    """Copy an uploaded calibration file (Gradio's temporary file) into the data dir's uploads folder,
    named by its content, after checking its size; returns the stored path (or None)."""
    if not upload:
        return None
    src = Path(upload)
    size = src.stat().st_size
    if size > MAX_UPLOAD_MB * 2**20:
        raise SubmitError(f"the uploaded file is {size / 2**20:.0f} MB; the limit is {MAX_UPLOAD_MB} MB")
    if src.suffix.lower() not in (".txt", ".jsonl", ".json"):
        raise SubmitError(f"upload a .txt, .jsonl or .json file, not {src.suffix or 'a file without extension'}")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:20]
    dest = service.settings.uploads_dir / f"{digest}{src.suffix.lower()}"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    return str(dest)


def from_form(service: JobService, form) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """(recipe, evaluations, methods) from the form values, validated; raises SubmitError.

    ``form``: the 12 fields of :func:`build_recipe`, then the "Perplexity on" choice, then the methods.
    """
    *fields, evaluate, methods = form
    fields[8] = store_upload(service, fields[8])  # the upload, where submissions may read it
    recipe = build_recipe(*fields)
    if not methods:
        raise SubmitError("pick at least one reconstruction method")
    evals = evaluations_for(evaluate, recipe["calibration"]["max_seq_length"])
    for m in methods:
        service.validate({**recipe, "reconstruction": {**recipe["reconstruction"], "method": m}}, evals, confine=True)
    recipe["reconstruction"]["method"] = methods[0]
    return recipe, evals, list(methods)


def validate_form(service: JobService, form) -> tuple[str, str, str | None]:
    """(status line, recipe YAML, path of the recipe file to download) for the Validate button."""
    try:
        recipe, _, _ = from_form(service, form)
    except SubmitError as exc:
        return shown(str(exc)), "", None
    text = yaml.safe_dump(recipe, sort_keys=False)
    out = service.settings.data_dir / "recipes" / f"{abs(hash(text)) % 10**10}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    path.write_text(text)
    return "✓ valid", text, str(path)


def submit_form(service: JobService, form, user: str | None) -> str:
    """Submit the form: one job, or a sweep of one job per reconstruction method. Returns the status line."""
    try:
        recipe, evals, methods = from_form(service, form)
        if len(methods) == 1:
            ids = [service.submit(recipe, submitted_by=user or None, evaluations=evals, confine=True)]
            msg = f"✓ submitted job {ids[0]}"
        else:
            group, ids = service.submit_sweep(
                recipe, methods=methods, submitted_by=user or None, evaluations=evals, confine=True
            )
            msg = f"✓ submitted sweep {group}: jobs {', '.join(map(str, ids))}"
    except (SubmitError, RuntimeError) as exc:
        return shown(str(exc))
    return msg


def api_evaluations(recipe_yaml: str, ppl: str | None, seq_len: int | float | None) -> list[dict[str, Any]]:
    """The perplexity evaluation an API submission asks for (none without ``ppl``); the window length
    defaults to 512, or to the model's positions if fewer."""
    if not ppl:
        return []
    length = int(seq_len or 0)
    if length <= 0:
        from core.pipeline.preflight import default_eval_seq_len

        try:
            model = Recipe.parse_yaml(recipe_yaml).get("model")
        except ValueError:
            model = None  # the service reports what is wrong with the recipe
        length = default_eval_seq_len(model)
    return [{"type": "perplexity", "dataset": str(ppl), "seq_len": length}]


def submit_yaml(service: JobService, text: str, evaluate: str | None, user: str | None) -> str:
    """Submit a recipe pasted or edited as YAML. Returns the status line."""
    if not text or not text.strip():
        return shown("the recipe box is empty: validate the form or paste a recipe")
    try:
        data = Recipe.parse_yaml(text)  # parsed once, here; the service validates the mapping
        calibration = data.get("calibration") if isinstance(data.get("calibration"), dict) else {}
        evals = evaluations_for(evaluate, calibration.get("max_seq_length", 128))
        job_id = service.submit(data, submitted_by=user or None, evaluations=evals, confine=True)
    except (SubmitError, RuntimeError) as exc:
        return shown(str(exc))
    except (ValueError, TypeError) as exc:  # the YAML itself, or a max_seq_length that is no number
        return shown(f"invalid recipe: {exc}")
    return f"✓ submitted job {job_id}"


# --- the Jobs tab --------------------------------------------------------------------------------


def job_rows(service: JobService, status: str | None = None) -> list[list[Any]]:
    """The jobs table: one row of :data:`TABLE_COLUMNS` per recent job, newest first."""
    rows = []
    for j in service.list(status=status or None, limit=200):
        layer = f"{j['layer']}/{j['n_layers']}" if j["n_layers"] else "–"
        rows.append(
            [
                j["id"],
                j["status"],
                j["stage"] or "–",
                layer,
                bar(j["progress"] or 0.0),
                elapsed(j["elapsed_s"]),
                j["submitted_by"] or "–",
                Path(str(j["model"])).name,
                j["ratio"],
                j["method"],
                j["criterion"],
            ]
        )
    return rows


def _no_job(exc: Exception) -> str:
    return shown(exc.args[0] if exc.args else "pick a job id")


def cancel_job(service: JobService, job_id) -> str:
    try:
        return f"job {int(job_id)}: {service.cancel(int(job_id))}"
    except (KeyError, TypeError) as exc:
        return _no_job(exc)


def rerun_job(service: JobService, job_id) -> str:
    """Submit a job's recipe and evaluations again, as the same user."""
    try:
        info = service.show(int(job_id))
        new = service.submit(info["recipe"], submitted_by=info["submitted_by"], evaluations=info["evaluations"])
        return f"re-submitted job {int(job_id)} as job {new}"
    except (KeyError, TypeError, SubmitError) as exc:
        return _no_job(exc)


def job_panel(service: JobService, job_id, lines: int = 20) -> tuple[str, str]:
    """(log tail, stage timings per stage) of the picked job, from one read of it; empty if none."""
    try:
        info = service.show(int(job_id))
    except (KeyError, TypeError):
        return "", ""
    tail = "\n".join(f"{x['at'][11:19]} {x['level']:7s} {x['message']}" for x in info["log"][-lines:])
    return tail, listings.timings_markdown(info["timings"], steps=False)  # per layer: the model page


def job_timings(service: JobService, job_id) -> str:
    """The picked job's stage timings (per stage; the model page has them per layer too)."""
    return job_panel(service, job_id)[1]


def log_tail(service: JobService, job_id, lines: int = 20) -> str:
    return job_panel(service, job_id, lines)[0]


# --- the Dashboard -------------------------------------------------------------------------------


def run_rows(service: JobService, model="", method="", user="", criterion="") -> list[dict[str, Any]]:
    """One row of :data:`RUN_COLUMNS` per succeeded job that passes the filters (empty: any)."""
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
    return rows


def dashboard_data(service: JobService, model="", method="", user="", metric="perplexity", criterion=""):
    """(runs table, plot data: the runs with ``metric`` renamed ``value``) as pandas DataFrames."""
    import pandas as pd

    df = pd.DataFrame(run_rows(service, model, method, user, criterion), columns=RUN_COLUMNS)
    return df, df.dropna(subset=[metric]).rename(columns={metric: "value"})


# --- the Model page ------------------------------------------------------------------------------


def model_page(service: JobService, job_id):
    """(heading + metrics + timings, recipe YAML, per-layer report rows, model card + snippet, the
    download links (Markdown), error curve)."""
    if not job_id:
        return "Pick a job id.", "", None, "", "", None
    try:
        info = service.show(int(job_id))
    except KeyError as exc:
        return f"**{exc.args[0]}**", "", None, "", "", None
    report = [
        [r["layer"], r["module"], r["kept"], r["total"], round(r["error_before"], 4), round(r["error_after"], 4)]
        for r in info["report"] or []
    ]
    ckpt = next((a["path"] for a in info["artifacts"] if a["kind"] == "checkpoint"), None)
    return (
        _page_head(info),
        yaml.safe_dump(info["recipe"], sort_keys=False),
        report,
        _page_card(ckpt),
        listings.downloads_markdown(service, info["id"]),
        error_curve(info["report"]),
    )


def _page_head(info: dict[str, Any]) -> str:
    head = (
        f"### Job {info['id']} — {info['status']}\n\n`{info['model']}` · ratio {info['ratio']} · "
        f"{info['method']} · {info['criterion']} · by {info['submitted_by'] or '–'}"
    )
    if info["error"]:
        head += f"\n\n**Error:** {info['error']}"
    metrics = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted(info["metrics"].items()))
    if metrics:
        head += "\n\n| metric | value |\n|---|---|\n" + metrics
    timings = listings.timings_markdown(info.get("timings"))
    if timings:
        head += "\n\n#### Where the time went\n\n" + timings
    return head


def _page_card(ckpt: str | None) -> str:
    """The checkpoint's model card (without its front matter) and a snippet that loads it."""
    card = Path(ckpt, "README.md").read_text() if ckpt and Path(ckpt, "README.md").exists() else ""
    if card.startswith("---"):  # drop the card's YAML front matter (hub metadata)
        card = card.split("---", 2)[-1].lstrip()
    if not ckpt:
        return card
    snippet = (
        f"from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(\n"
        f'    "{ckpt}", trust_remote_code=True)'
    )
    return card + "\n\n```python\n" + snippet + "\n```"


def error_curve(report: list[dict[str, Any]] | None):
    """The per-projection error before and after reconstruction, in layer order (a pandas DataFrame)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {"projection": f"{r['layer']}.{r['module'][:4]}", "step": i, "error": r[key], "when": when}
            for i, r in enumerate(report or [])
            for key, when in (("error_before", "pruned"), ("error_after", "reconstructed"))
        ],
        columns=["projection", "step", "error", "when"],
    )
