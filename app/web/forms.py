"""What the New-run tab does, as plain functions of a :class:`JobService` and plain values (no Gradio).

The tab modules build the components and turn these return values into Gradio updates; everything a
test needs to check (the recipe a form makes, the messages it shows) lives here, and in ``views``
(the Jobs tab and the Model page) and ``charts`` (the dashboard).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from app.web.fields import K_QUANT, FieldError, field_for, round_to_field
from core.models.liar_families import family_of, supported_families_text, unsupported_reason
from core.spec.criteria import CRITERIA as _CRITERIA
from core.spec.recipe import EXPORT_FORMATS, NAMED_DATASETS, Recipe
from core.spec.recipe import METHODS as _METHODS
from jobs.access import OPEN, Actor
from jobs.references import UPLOAD, UPLOADS, job_reference, upload_reference
from jobs.service import JobService, QueueError, SubmitError

METHODS = list(_METHODS)
# every registered criterion; their options go in the recipe YAML below the form
CRITERIA = ["auto", *_CRITERIA]
CRITERION_LINE = (
    "auto (the default) picks for the model: obs for decoders up to 50%, kwon for a labelled encoder, "
    "otherwise uniform shares (flap when no refit follows, for a decoder)"
)
NAMED_SETS = list(NAMED_DATASETS)
MAX_UPLOAD_MB = 50
ROUND_CHOICES = ["auto", 1, 8, 16, 32, 64, 128, K_QUANT]
KV_GROUP_CHOICES = ["free", "whole", "auto"]  # round_to.kv_groups; the first is the recipe's default
SERVING_FORMS = list(EXPORT_FORMATS)  # the recipe's export: files written into the checkpoint after it is saved
SERVING_INFO = (
    "GGUF runs in llama.cpp and ollama; q4_k_m is about a quarter of f16's size; quantized forms need "
    "llama.cpp on the worker. vllm: a folder vLLM serves; ticking it keeps the same number of query heads "
    "in every layer (query_heads: uniform), which vLLM needs"
)
# the fields of build_recipe, in the order the New-run tab passes them
RECIPE_FIELDS = (
    "model",
    "modules",
    "ratio",
    "allocation",
    "round_neurons",
    "kv_groups",
    "criterion",
    "damp",
    "calibration",
    "upload",
    "text_field",
    "label_field",
    "samples",
    "seq_len",
    "seed",
    "export",
)
NO_EVALUATION = "(none)"
EVAL_WINDOWS = 64  # held-out windows a form's perplexity reads (all of the bundled text: minutes a side)
MAX_FORM_JOBS = 48  # ratios × methods one form submission may queue (a bigger grid: `liar sweep` or the API)
KEEP_RECIPE_FILES = 200  # validated recipes kept for download (the oldest go first)


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


class Status(str):
    """A status line; ``field``: the form box an error is about (:func:`app.web.fields.field_for`;
    None for a success or the form as a whole), where the tab repeats it."""

    field: str | None = None
    message: str = ""  # the sentence itself, without the line's decoration


def shown(message: str | Exception) -> Status:
    """An error message as the status line shows it, knowing its box."""
    line = Status(f"**⚠ {message}**")
    line.message = str(message)
    line.field = field_for(message) if isinstance(message, SubmitError) else None
    return line


def submitter(user: str | None, request: Any = None) -> str | None:
    """Who submits: with login on, the account (``request.username``); else the name typed in the form."""
    if request is not None and getattr(request, "username", None):
        return request.username
    return user or None


# --- the New-run form ----------------------------------------------------------------------------


def evaluations_for(evaluate: str | None, seq_len) -> list[dict[str, Any]]:
    """The job's evaluations for the "Perplexity on" choice: none, or perplexity on that text's start."""
    if not evaluate or evaluate == NO_EVALUATION:
        return []
    return [{"type": "perplexity", "dataset": str(evaluate), "seq_len": int(seq_len), "max_windows": EVAL_WINDOWS}]


def task_evaluation(tasks, task_dir=None) -> list[dict[str, Any]]:
    """The lm-eval evaluation the task boxes ask for: none when no task is named; the names are
    checked by the job service (the registry, and the folder's local YAMLs)."""
    names, folder = str(tasks or "").strip(), str(task_dir or "").strip()
    if not names:
        if folder:
            raise FieldError("tasks", "a task folder needs task names (lm-eval tasks)")
        return []
    return [{"type": "lm_eval", "tasks": names, **({"task_dir": folder} if folder else {})}]


def describe_model(model: str | None, readable: Callable[[str], bool] | None = None) -> tuple[str | None, str]:
    """("decoder" | "encoder" | None, a one-line description) from a local model's config.json;
    ``readable``: whether the server may read a path (a web form's: ``JobService.readable``), checked
    before anything is read."""
    if job_reference(model) is not None:
        return None, "a job's checkpoint: checked when you validate or submit"
    path = Path(str(model or "")).expanduser() / "config.json"
    if readable is not None and model and path.parent.exists() and not readable(str(path.parent)):
        return None, "⚠ that folder is outside the folders this server reads from"
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


def model_hint(model: str | None, readable: Callable[[str], bool] | None = None) -> tuple[str, bool]:
    """(the line above the model picker, whether perplexity applies): not to encoders."""
    kind, text = describe_model(model, readable)
    if kind == "encoder":
        return text + " — perplexity does not apply", False
    return text, True


SPEEDUP = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*[x×]$", re.IGNORECASE)


def parse_amount(text) -> list[float] | float:
    """The ratio box: its ratios (:func:`parse_ratios`), or one batch-1 decode speed-up typed as ``1.5x``
    (returned as a float above 1: the recipe's ``target.speedup``)."""
    parts = [p for p in re.split(r"[,;\s]+", str(text or "").strip()) if p]
    speedups = [m for m in (SPEEDUP.match(p) for p in parts) if m]
    if not speedups:
        return parse_ratios(text)
    if len(parts) > 1:
        raise FieldError("ratio", "a speed-up (1.5x) goes alone in the ratio box: one target per submission")
    value = float(speedups[0].group(1))
    if not 1 < value <= 20:
        raise FieldError("ratio", f"a speed-up must lie above 1x and at most 20x, got {parts[0]}")
    return value


def parse_ratios(text) -> list[float]:
    """The ratios typed in the form — ``0.2``, ``20%``, or several (``0.2, 0.3 0.5``) for a sweep —
    each strictly between 0 and 1, in the order typed, without repeats. Nothing is clamped: a bad one
    raises SubmitError naming it."""
    if isinstance(text, (int, float)):
        parts = [str(text)]
    else:
        parts = [p for p in re.split(r"[,;\s]+", str(text or "").replace("−", "-").strip()) if p]  # (U+2212)
    if not parts:
        raise FieldError("ratio", "enter a ratio between 0 and 1 (several, separated by commas, make a sweep)")
    ratios: list[float] = []
    words, outside = [], []  # every bad one is named, not just the first
    for part in parts:
        try:
            ratio = round(float(part[:-1]) / 100 if part.endswith("%") else float(part), 6)
        except (ValueError, OverflowError):
            words.append(repr(part))
            continue
        if not (0 < ratio < 1) or math.isnan(ratio):
            outside.append(part)
        elif ratio not in ratios:
            ratios.append(ratio)
    problems = []
    if words:
        one = len(words) == 1
        what = f"ratio {words[0]} is not a number" if one else f"ratios {_joined(words)} are not numbers"
        problems.append(what)
    if outside:
        one = len(outside) == 1
        what = f"ratio {outside[0]} must lie" if one else f"ratios {_joined(outside)} must each lie"
        problems.append(f"{what} strictly between 0 and 1 (the fraction of the blocks' parameters to remove)")
    if problems:
        raise FieldError("ratio", "; ".join(problems))
    return ratios


def _amount(amount: list[float] | float) -> dict[str, Any]:
    """The recipe's ratio (the first typed), or its speed target."""
    if isinstance(amount, list):
        return {"ratio": amount[0]}
    return {"target": {"speedup": amount, "workload": "decode_b1"}}


def _joined(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _number(value, name: str, field: str, whole: bool = True, minimum: float | None = None) -> int | float:
    """A number box's value, or a FieldError naming the box (``name``; ``field``: its form field)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        got = "nothing" if value in (None, "") else repr(value)
        raise FieldError(field, f"{name} must be a number, got {got}") from None
    if math.isnan(number) or (whole and not number.is_integer()):
        raise FieldError(field, f"{name} must be a whole number, got {value!r}")
    if minimum is not None and number < minimum:
        raise FieldError(field, f"{name} must be at least {minimum:g}, got {number:g}")
    return int(number) if whole else number


def build_recipe(
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
    export=None,
) -> dict[str, Any]:
    """The recipe dict of the form's fields (not yet validated by the recipe schema; ``ratio``: the
    first of :func:`parse_ratios`, or a speed target for ``1.5x`` (:func:`parse_amount`); ``export``:
    the serving forms ticked, checked by the recipe);
    raises SubmitError."""
    if not model or not str(model).strip():
        raise FieldError("model", "choose a model: a Hugging Face id or a local directory")
    source = upload if upload else calibration
    if not source or not str(source).strip():
        raise FieldError("calibration", "choose a calibration set or upload a .txt / .jsonl file")
    rounding = round_to_field(round_neurons, kv_groups, KV_GROUP_CHOICES)
    fields = _record_fields(text_field, label_field)
    serving = {"export": list(export)} if export else {}  # none: the recipe stays as short as before
    if "vllm" in serving.get("export", []) and modules != "neurons":
        serving["query_heads"] = "uniform"  # vLLM's form states one query-head count for every layer
    return {
        "model": str(model).strip(),
        "modules": modules,
        **_amount(parse_amount(ratio)),
        "allocation": allocation,
        **rounding,
        "criterion": {"name": criterion},
        "reconstruction": {"method": "ls", "damp": _number(damp, "damping", "damp", whole=False, minimum=0)},
        "calibration": {
            "dataset": str(source).strip(),
            **fields,
            "num_calibration_samples": _number(samples, "samples", "samples", minimum=1),
            "max_seq_length": _number(seq_len, "sequence length", "seq_len", minimum=2),
            "seed": _number(seed, "seed", "seed"),
        },
        **serving,
    }


def _record_fields(text_field, label_field) -> dict[str, Any]:
    """The calibration's ``text_field`` / ``label_field`` from the form's boxes (a .jsonl file's record
    fields): only what differs from the defaults (``text``, no label), so a plain-text run's recipe
    stays as short as before. Two text fields, comma-separated, make an encoder's sentence pair."""
    texts = [t.strip() for t in str(text_field or "").split(",") if t.strip()]
    if len(texts) > 2:
        message = f"give one text field, or two for a sentence pair, not {len(texts)}: {text_field!r}"
        raise FieldError("text_field", message)
    label = str(label_field or "").strip()
    if label and label in texts:
        raise FieldError("label_field", f"the label field {label!r} is also a text field")
    out: dict[str, Any] = {}
    if texts and texts != ["text"]:
        out["text_field"] = texts[0] if len(texts) == 1 else texts
    if label:
        out["label_field"] = label
    return out


def store_upload(service: JobService, upload: str | None) -> str | None:
    """Put an uploaded calibration file (Gradio's temporary file) into the store's uploads folder, named
    by its content, after checking its size (a worker on another host reads it there); ``upload:<name>``."""
    if not upload:
        return None
    src = Path(upload)
    size = src.stat().st_size
    if size > MAX_UPLOAD_MB * 2**20:
        raise FieldError("upload", f"the uploaded file is {size / 2**20:.0f} MB; the limit is {MAX_UPLOAD_MB} MB")
    if src.suffix.lower() not in (".txt", ".jsonl", ".json"):
        kind = src.suffix or "a file without extension"
        raise FieldError("upload", f"upload a .txt, .jsonl or .json file, not {kind}")
    name = f"{hashlib.sha256(src.read_bytes()).hexdigest()[:20]}{src.suffix.lower()}"
    store, key = service.settings.store(), f"{UPLOADS}/{name}"
    dest = store.path(key)  # the store's file, or this host's copy of it
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    if store.local is None and not store.exists(key):  # a remote store: this host's copy goes up
        store.put(dest, key)
    return f"{UPLOAD}{name}"


class FormRun(NamedTuple):
    """A validated form: the recipe (of the first ratio and method), the evaluations, and the sweep."""

    recipe: dict[str, Any]
    evaluations: list[dict[str, Any]]
    methods: list[str]
    ratios: list[float | None]  # [None]: one speed target in place of ratios

    @property
    def n_jobs(self) -> int:
        return len(self.methods) * len(self.ratios)

    def document(self) -> str:
        """The run as YAML: the recipe of one job; for a sweep, a grid (``base`` and ``grid``, the form
        of ``liar sweep``'s files) that "Submit this YAML" submits whole."""
        if self.n_jobs == 1:
            return yaml.safe_dump(self.recipe, sort_keys=False)
        axes: dict[str, list] = {"ratio": list(self.ratios)} if len(self.ratios) > 1 else {}
        axes.update({"reconstruction": list(self.methods)} if len(self.methods) > 1 else {})
        return yaml.safe_dump({"base": self.recipe, "grid": axes}, sort_keys=False)  # (grid.ratio wins)

    def describe(self) -> str:
        """``3 ratios × 2 methods`` for a sweep."""
        parts = [f"{len(self.ratios)} ratios"] if len(self.ratios) > 1 else []
        parts += [f"{len(self.methods)} methods"] if len(self.methods) > 1 else []
        return " × ".join(parts)


def from_form(service: JobService, form, actor: Actor = OPEN) -> FormRun:
    """The form values as a validated :class:`FormRun` (every ratio × method checked against the
    model's config); raises SubmitError.

    ``form``: the :data:`RECIPE_FIELDS` of :func:`build_recipe`, then the "Perplexity on" choice, the
    lm-eval tasks and their folder, then the methods.
    """
    *fields, evaluate, tasks, task_dir, methods = form
    values = dict(zip(RECIPE_FIELDS, fields, strict=True))
    amount = parse_amount(values["ratio"])
    ratios: list[float | None] = amount if isinstance(amount, list) else [None]  # None: the speed target
    uploaded = values["upload"]
    values["upload"] = store_upload(service, uploaded)  # in the store, named upload:<name>
    # a message about the stored copy names the file as it was uploaded, not the server's copy
    stored = values["upload"] and str(service.settings.store().path(upload_reference(values["upload"])))
    known = {stored: Path(uploaded).name, values["upload"]: Path(uploaded).name} if stored else {}
    recipe = build_recipe(**values)
    if not methods:
        raise FieldError("methods", "pick at least one reconstruction method")
    if len(ratios) * len(methods) > MAX_FORM_JOBS:
        raise FieldError(
            "ratio",
            f"{len(ratios)} ratios × {len(methods)} methods is {len(ratios) * len(methods)} jobs; the form "
            f"queues at most {MAX_FORM_JOBS} (use `liar sweep` for a bigger grid)",
        )
    evals = evaluations_for(evaluate, recipe["calibration"]["max_seq_length"]) + task_evaluation(tasks, task_dir)
    for i, (ratio, m) in enumerate((ratio, m) for ratio in ratios for m in methods):
        cell = {**recipe, "reconstruction": {**recipe["reconstruction"], "method": m}}
        cell.update({"ratio": ratio} if ratio is not None else {})
        try:  # one model, one set of forms
            service.validate(cell, evals, confine=True, check_export=i == 0, actor=actor)
        except SubmitError as exc:
            message = str(exc)
            for server, name in known.items():
                if server in message:  # about the uploaded file: said under the upload box
                    raise FieldError("upload", message.replace(server, name)) from None
            raise exc from None
    recipe["reconstruction"]["method"] = methods[0]
    return FormRun(recipe, evals, list(methods), ratios)


def store_recipe(service: JobService, text: str) -> Path:
    """The recipe YAML as a file to download, named by its content (validating the same form again
    writes nothing new); only the newest :data:`KEEP_RECIPE_FILES` are kept."""
    root = service.settings.data_dir / "recipes"
    out = root / hashlib.sha256(text.encode()).hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    out.touch()  # the newest, whether written now or before
    folders = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for old in folders[KEEP_RECIPE_FILES:]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def check_form(service: JobService, form, actor: Actor = OPEN) -> Status | str:
    """The form's first problem as a status line (its box in ``field``), or "" when it is valid;
    writes nothing but the uploaded file's stored copy."""
    try:
        from_form(service, form, actor)
    except SubmitError as exc:
        return shown(exc)
    return ""


def validate_form(service: JobService, form, actor: Actor = OPEN) -> tuple[str, str, str | None]:
    """(status line, recipe YAML, path of the recipe file to download) for the Validate button."""
    try:
        run = from_form(service, form, actor)
    except SubmitError as exc:
        return shown(exc), "", None
    text = run.document()
    message = "✓ valid"
    if run.n_jobs > 1:
        message += f": a sweep of {run.n_jobs} jobs ({run.describe()}); the YAML holds all of them"
    return message, text, str(store_recipe(service, text))


def submit_form(service: JobService, form, user: str | None, actor: Actor = OPEN) -> str:
    """Submit the form: one job, or a sweep of one job per ratio × reconstruction method. Returns the
    status line."""
    try:
        run = from_form(service, form, actor)
        if run.n_jobs == 1:
            evals = run.evaluations
            job_id = service.submit(run.recipe, submitted_by=user or None, evaluations=evals, confine=True, actor=actor)
            return f"✓ submitted job {job_id}"
        group, ids = service.submit_sweep(
            run.recipe,
            ratios=run.ratios if len(run.ratios) > 1 else None,
            methods=run.methods if len(run.methods) > 1 else None,
            submitted_by=user or None,
            evaluations=run.evaluations,
            confine=True,
            actor=actor,
        )
    except (SubmitError, QueueError) as exc:
        return shown(exc)
    return f"✓ submitted sweep {group} of {len(ids)} jobs ({run.describe()}): jobs {', '.join(map(str, ids))}"


def api_evaluations(recipe_yaml: str, ppl: str | None, seq_len: int | float | None, local: Callable) -> list[dict]:
    """The perplexity evaluation an API submission asks for (none without ``ppl``); the window length
    defaults to 512, or to the model's positions if fewer (``local``: its folder here, ``jobs.names``)."""
    if not ppl:
        return []
    length = int(seq_len or 0)
    if length <= 0:
        from core.pipeline.preflight import default_eval_seq_len

        try:
            model = Recipe.parse_yaml(recipe_yaml).get("model")
        except ValueError:
            model = None  # the service reports what is wrong with the recipe
        length = default_eval_seq_len(local(model))
    return [{"type": "perplexity", "dataset": str(ppl), "seq_len": length}]
