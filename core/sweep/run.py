"""Sweeps: one command runs a grid of pruning runs, evaluates each, and tabulates and plots the results.

A grid file (YAML) is a base recipe, lists of values to vary and an evaluation::

    name: SmolLM2 magnitude sweep           # optional title for the report
    base:                                   # a recipe mapping, or the path of a recipe YAML
      modules: both
      calibration: {dataset: calib.txt, num_calibration_samples: 128, max_seq_length: 128}
      dtype: float32
      device: cpu
    grid:                                   # each axis: a list (a single value is a list of one)
      model: [path/to/model]                # or {path: ..., label: ...}
      criterion: [magnitude, {name: flap, options: {structure: AL-AM}, allocation: global}]
      reconstruction: [none, bias, liar, ls, {method: ls, damp: 0.01, label: "ls λ=0.01"}]
      ratio: [0.2, 0.5]
    evaluation:
      perplexity: {text: eval.txt, seq_len: 512, max_windows: 40, batch_size: 4}   # decoders
      metrics: ["mypkg.tasks:accuracy"]     # callables fn(model, tokenizer, **options) -> {name: value}
      metric: perplexity                    # the metric of the tables and plots (default: perplexity)
    dense: true                             # also evaluate each unpruned model (the baseline row)
    plots: {error_ratio: 0.5}               # the ratio of the per-layer error plot (default: the largest)

Axes left out of ``grid`` take the base recipe's value. Relative paths are relative to the working
directory, as for ``liar prune``.

Every cell (one model × criterion × reconstruction × ratio, or one dense baseline) is a resolved
:class:`~core.spec.recipe.Recipe` plus the evaluation; its id is a hash of those (recipe fields left at their
default values do not enter it), prefixed with readable labels. Each finished cell is appended at once
as one JSON line to ``<out>/results.jsonl`` — its metrics, summary and per-layer errors from
``PruneResult.report`` — so re-running the same command skips finished cells: an interrupted sweep
resumes, a grown grid runs only its new cells, and a cell that failed (recorded with its error) is
tried again. Changing the base recipe or the evaluation changes every id, so stale results are never
reused. At the end the sweep writes ``results.csv``, ``results.md`` and PNG plots from the records of
the current grid (``liar sweep GRID --out DIR --report-only`` rebuilds them at any time).

The whole grid is validated before anything runs: unknown keys, empty or duplicated axis values,
ratios outside (0, 1), unimportable metric callables, and every cell's recipe through ``Recipe``'s own
validation. Cells run in this process by default; ``isolate=True`` runs each in a fresh subprocess so
that peak memory (and a crash) is per cell, with its log kept in ``<out>/logs/``.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import gc
import hashlib
import importlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.spec.recipe import NAMED_DATASETS, Recipe

AXES = ("model", "criterion", "reconstruction", "ratio")
TOP_KEYS = ("name", "base", "grid", "evaluation", "dense", "plots")
RESULTS = "results.jsonl"
Log = Callable[[str], None]


class GridError(ValueError):
    """An invalid grid file; ``problems`` lists every problem found, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid grid:\n" + "\n".join(f"  {p}" for p in problems))


# --- the grid file --------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelEntry(_Strict):
    path: str = Field(..., description="hub id or local directory")
    label: str | None = None


class CriterionEntry(_Strict):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)
    allocation: Literal["uniform", "global"] | None = Field(None, description="overrides the base recipe's")
    label: str | None = None


class ReconstructionEntry(_Strict):
    method: str
    damp: float | None = Field(None, ge=0.0, description="overrides the base recipe's damping")
    label: str | None = None


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) or value is None else [value]


class GridAxes(_Strict):
    model: list[ModelEntry] | None = None
    criterion: list[CriterionEntry] | None = None
    reconstruction: list[ReconstructionEntry] | None = None
    ratio: list[float] | None = None

    @field_validator("model", "criterion", "reconstruction", mode="before")
    @classmethod
    def _entries(cls, v: Any, info) -> Any:
        """A bare string stands for the entry's main field (path / name / method)."""
        key = {"model": "path", "criterion": "name", "reconstruction": "method"}[info.field_name]
        return [{key: x} if isinstance(x, str) else x for x in _as_list(v)] if v is not None else v

    @field_validator("ratio", mode="before")
    @classmethod
    def _ratios_list(cls, v: Any) -> Any:
        return _as_list(v)

    @field_validator("model", "criterion", "reconstruction", "ratio")
    @classmethod
    def _not_empty(cls, v: list | None) -> list | None:
        if v is not None and not v:
            raise ValueError("an empty list: give at least one value, or leave the axis out to use the base recipe's")
        return v

    @field_validator("ratio")
    @classmethod
    def _ratios(cls, v: list[float] | None) -> list[float] | None:
        for r in v or []:
            if not (math.isfinite(r) and 0.0 < r < 1.0):
                raise ValueError(f"ratio {r} is not strictly between 0 and 1")
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"duplicated ratios in {v}")
        return v


class PerplexitySpec(_Strict):
    text: str = Field(..., description=f"a named set {NAMED_DATASETS} or a local .txt / .jsonl / .json file")
    seq_len: int = Field(512, ge=2)
    max_windows: int | None = Field(None, gt=0)
    batch_size: int = Field(4, gt=0)

    @field_validator("text")
    @classmethod
    def _exists(cls, v: str) -> str:
        if v not in NAMED_DATASETS and not Path(v).expanduser().is_file():
            raise ValueError(f"{v!r} is neither a named set {NAMED_DATASETS} nor an existing file")
        return v


class MetricSpec(_Strict):
    callable: str = Field(..., description="'package.module:function' → fn(model, tokenizer, **options) -> dict")
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("callable")
    @classmethod
    def _importable(cls, v: str) -> str:
        resolve_callable(v)
        return v


class EvaluationSpec(_Strict):
    perplexity: PerplexitySpec | None = None
    metrics: list[MetricSpec] = Field(default_factory=list)
    metric: str | None = Field(None, description="the metric of the tables and plots")
    log_scale: bool | None = Field(None, description="log-scale metric axis (default: for perplexity)")

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, v: Any) -> Any:
        return [{"callable": x} if isinstance(x, str) else x for x in _as_list(v) or []]

    @model_validator(mode="after")
    def _something(self) -> EvaluationSpec:
        if self.perplexity is None and not self.metrics:
            raise ValueError("evaluation needs 'perplexity' and/or 'metrics'")
        if self.metric is None and self.perplexity is not None:
            self.metric = "perplexity"
        return self


class PlotSpec(_Strict):
    error_ratio: float | None = Field(None, description="ratio of the per-layer error plot (default: the largest)")


class SweepSpec(_Strict):
    name: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    grid: GridAxes = Field(default_factory=GridAxes)
    evaluation: EvaluationSpec
    dense: bool = True
    plots: PlotSpec = Field(default_factory=PlotSpec)


def resolve_callable(path: str) -> Callable[..., Any]:
    """``'package.module:function'`` (or ``package.module.function``) → the function; clear errors."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"metric callable {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"metric callable {path!r}: cannot import {module_name!r} ({exc})") from exc
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"metric callable {path!r}: {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"metric callable {path!r} is not callable")
    return fn


# --- cells -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One run of the grid: a pruning run (``kind == "prune"``) or a dense baseline (``"dense"``)."""

    id: str
    kind: str
    model: str
    model_label: str
    criterion: str | None = None
    reconstruction: str | None = None
    ratio: float | None = None
    recipe: dict[str, Any] | None = None  # the validated recipe, JSON form (prune cells)
    dtype: str = "auto"
    device: str = "auto"

    def params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_label": self.model_label,
            "criterion": self.criterion,
            "reconstruction": self.reconstruction,
            "ratio": self.ratio,
        }

    def describe(self) -> str:
        if self.kind == "dense":
            return f"{self.model_label} dense"
        return f"{self.model_label} {self.criterion} {self.reconstruction} ratio={self.ratio:g}"

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:40] or "x"


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _criterion_label(c: CriterionEntry) -> str:
    if c.label:
        return c.label
    opts = ",".join(f"{k}={v}" for k, v in sorted(c.options.items()))
    return c.name + (f"({opts})" if opts else "") + (f"+{c.allocation}" if c.allocation else "")


def _method_label(r: ReconstructionEntry) -> str:
    return r.label or (r.method if r.damp is None else f"{r.method} (damp={r.damp:g})")


@dataclass
class Sweep:
    """A validated grid: the spec, every cell in run order, and the axis labels in grid order."""

    spec: SweepSpec
    cells: list[Cell]
    models: list[str]  # labels
    criteria: list[str]
    methods: list[str]
    ratios: list[float]
    source: str = ""

    @property
    def prune_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "prune"]


def _format_validation(exc: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{prefix}{loc or 'grid'}: {msg}")
    return lines


def parse_grid(data: Any, source: str = "<grid>") -> Sweep:
    """Validate a grid (already parsed YAML) and expand it into cells; raises :class:`GridError`."""
    if not isinstance(data, dict):
        raise GridError([f"{source}: a grid file must be a YAML mapping with keys {', '.join(TOP_KEYS)}"])
    problems = [f"{k}: unknown key; a grid file has {', '.join(TOP_KEYS)}" for k in data if k not in TOP_KEYS]
    grid = data.get("grid")
    if isinstance(grid, dict):
        problems += [
            f"grid.{k}: unknown axis; a grid varies {', '.join(AXES)} (fix other recipe fields in 'base')"
            for k in grid
            if k not in AXES
        ]
    known = {k: v for k, v in data.items() if k in TOP_KEYS}
    if isinstance(grid, dict):
        known["grid"] = {k: v for k, v in grid.items() if k in AXES}
    try:
        spec = SweepSpec.model_validate(known)
    except ValidationError as exc:
        raise GridError(problems + _format_validation(exc)) from None
    if problems:
        raise GridError(problems)

    base = spec.base
    if isinstance(base, str):
        path = Path(base).expanduser()
        if not path.is_file():
            raise GridError([f"base: recipe file {base!r} does not exist"])
        base = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(base, dict):
            raise GridError([f"base: {str(path)!r} is not a YAML mapping"])
    base = dict(base)
    g = spec.grid
    models = g.model or ([ModelEntry(path=str(base["model"]))] if "model" in base else [])
    if not models:
        raise GridError(["grid.model: no model: list models in grid.model or set base.model"])
    if g.criterion:
        criteria = g.criterion
    else:
        crit = base.get("criterion", {"name": "magnitude"})
        criteria = [CriterionEntry(name=crit) if isinstance(crit, str) else CriterionEntry.model_validate(crit)]
    if g.reconstruction:
        methods = g.reconstruction
    else:
        rec = base.get("reconstruction", {"method": "liar"})
        methods = [ReconstructionEntry(method=rec.get("method", "liar") if isinstance(rec, dict) else str(rec))]
    if g.ratio:
        ratios = g.ratio
    elif "ratio" in base:
        ratios = [base["ratio"]]
    else:
        raise GridError(["grid.ratio: no ratio: list ratios in grid.ratio or set base.ratio"])

    model_labels = _unique_labels([m.label or Path(m.path.rstrip("/")).name or m.path for m in models])
    crit_labels = [_criterion_label(c) for c in criteria]
    method_labels = [_method_label(r) for r in methods]
    for axis, labels in (("model", model_labels), ("criterion", crit_labels), ("reconstruction", method_labels)):
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            problems.append(f"grid.{axis}: duplicated entries {dupes} (give each a distinct 'label' if intended)")
    if len({m.path for m in models}) != len(models):
        problems.append("grid.model: the same model is listed twice")
    if spec.plots.error_ratio is not None and spec.plots.error_ratio not in ratios:
        problems.append(f"plots.error_ratio: {spec.plots.error_ratio} is not one of the grid's ratios {ratios}")
    if problems:
        raise GridError(problems)

    evaluation = spec.evaluation.model_dump(mode="json", exclude_defaults=True)
    cells: list[Cell] = []
    cell_errors: dict[str, list[str]] = {}
    for model, model_label in zip(models, model_labels):
        dtype, device = str(base.get("dtype", "auto")), str(base.get("device", "auto"))
        if spec.dense:
            payload = {"dense": model.path, "dtype": dtype, "device": device, "evaluation": evaluation}
            cells.append(
                Cell(
                    id=f"{_slug(model_label)}-dense-{_digest(payload)}",
                    kind="dense",
                    model=model.path,
                    model_label=model_label,
                    dtype=dtype,
                    device=device,
                )
            )
        for crit, crit_label in zip(criteria, crit_labels):
            for ratio in ratios:
                for method, method_label in zip(methods, method_labels):
                    data_ = json.loads(json.dumps(base))  # deep copy
                    data_.update(model=model.path, ratio=ratio)
                    data_["criterion"] = {"name": crit.name, "options": crit.options}
                    if crit.allocation is not None:
                        data_["allocation"] = crit.allocation
                    rec = data_.get("reconstruction")
                    rec = dict(rec) if isinstance(rec, dict) else {}
                    rec["method"] = method.method
                    if method.damp is not None:
                        rec["damp"] = method.damp
                    data_["reconstruction"] = rec
                    where = f"{model_label} / {crit_label} / {method_label} / ratio {ratio:g}"
                    try:
                        recipe = Recipe.model_validate(data_)
                    except ValidationError as exc:
                        for line in _format_validation(exc, "recipe."):
                            cell_errors.setdefault(line, []).append(where)
                        continue
                    payload = {
                        "recipe": recipe.model_dump(mode="json", exclude_defaults=True),
                        "evaluation": evaluation,
                    }
                    name = f"{_slug(model_label)}-{_slug(crit_label)}-{_slug(method_label)}-r{ratio:g}"
                    cells.append(
                        Cell(
                            id=f"{name}-{_digest(payload)}",
                            kind="prune",
                            model=model.path,
                            model_label=model_label,
                            criterion=crit_label,
                            reconstruction=method_label,
                            ratio=ratio,
                            recipe=recipe.model_dump(mode="json"),
                            dtype=dtype,
                            device=device,
                        )
                    )
    if cell_errors:
        lines = []
        for msg, where in cell_errors.items():
            more = f" and {len(where) - 1} more" if len(where) > 1 else ""
            lines.append(f"{msg} (cell {where[0]}{more})")
        raise GridError(lines)
    return Sweep(spec, cells, model_labels, crit_labels, method_labels, list(ratios), source)


def load_grid(path: str | Path) -> Sweep:
    """Read and validate a grid YAML file."""
    path = Path(path)
    if not path.is_file():
        raise GridError([f"grid file {str(path)!r} does not exist"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise GridError([f"{path}: not valid YAML ({exc})"]) from None
    return parse_grid(data, str(path))


# --- running cells ---------------------------------------------------------------------------------
def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def evaluate_model(model, tokenizer, spec: EvaluationSpec) -> dict[str, Any]:
    """Perplexity (if configured) and every metric callable, merged into one flat dict."""
    from core.evaluation.perplexity import perplexity

    metrics: dict[str, Any] = {}
    if spec.perplexity is not None:
        p = spec.perplexity
        ppl = perplexity(
            model, tokenizer, p.text, seq_len=p.seq_len, batch_size=p.batch_size, max_windows=p.max_windows
        )
        metrics.update(perplexity=ppl["perplexity"], nll=ppl["nll"], eval_tokens=ppl["tokens"])
    for m in spec.metrics:
        out = resolve_callable(m.callable)(model, tokenizer, **m.options)
        if not isinstance(out, dict):
            raise TypeError(f"metric callable {m.callable} returned {type(out).__name__}, not a dict")
        metrics.update(out)
    return metrics


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# Criterion scores depend on the model, the criterion and the calibration data, never on the ratio or
# the reconstruction: cells run in this process share them (a few entries; scores are small).
_SCORES: dict[str, list] = {}


def _scores_key(recipe: dict[str, Any]) -> str:
    return json.dumps(
        {k: recipe.get(k) for k in ("model", "criterion", "calibration", "dtype", "device")}, sort_keys=True
    )


def run_cell(cell: Cell, evaluation: EvaluationSpec) -> dict[str, Any]:
    """Run one cell in this process and return its record; exceptions become a 'failed' record.

    ``KeyboardInterrupt`` (and other ``BaseException``) propagate: an interrupted cell leaves no record.
    """
    import core.models.loading as loading
    import core.pipeline.sequential as pipeline

    started, t0 = _now(), time.perf_counter()
    record: dict[str, Any] = {"id": cell.id, "kind": cell.kind, "params": cell.params(), "recipe": cell.recipe}
    model = tokenizer = result = None
    try:
        if cell.kind == "dense":
            model, tokenizer, _ = loading.load_model(cell.model, cell.dtype, cell.device)
            n = sum(p.numel() for p in model.parameters())
            summary: dict[str, Any] = {"params_before": n, "params_after": n, "achieved_ratio": 0.0}
            layers: list[dict[str, Any]] = []
        else:
            key = _scores_key(cell.recipe)
            result = pipeline.prune(Recipe.model_validate(cell.recipe), scores=_SCORES.get(key))
            if len(_SCORES) >= 4:
                _SCORES.pop(next(iter(_SCORES)))
            _SCORES[key] = result.scores
            model, tokenizer = result.model, result.tokenizer
            summary = result.summary()
            layers = [
                {
                    "layer": r.layer,
                    "module": r.module,
                    "kept": r.kept,
                    "total": r.total,
                    "error_before": r.error_before,
                    "error_after": r.error_after,
                    "measured_on": r.measured_on,
                    "seconds": r.seconds,
                }
                for r in result.report
            ]
            for module, key in (("attention", "attn"), ("ffn", "ffn")):
                rows = [r for r in layers if r["module"] == module]
                summary[f"{key}_error_before"] = _mean([r["error_before"] for r in rows])
                summary[f"{key}_error_after"] = _mean([r["error_after"] for r in rows])
            summary["reconstruct_seconds"] = sum(r["seconds"] for r in layers)
        t_eval = time.perf_counter()
        metrics = evaluate_model(model, tokenizer, evaluation)
        summary["eval_seconds"] = time.perf_counter() - t_eval
        record.update(status="ok", metrics=metrics, summary=summary, layers=layers, error=None)
    except Exception as exc:  # a failed cell is recorded and retried on the next run
        record.update(
            status="failed",
            metrics={},
            summary={},
            layers=[],
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=20),
        )
    finally:
        del model, tokenizer, result
        _free_memory()
    record.update(started=started, finished=_now(), seconds=time.perf_counter() - t0)
    return record


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_isolated(cell: Cell, evaluation: EvaluationSpec, out: Path) -> dict[str, Any]:
    """Run one cell in a fresh Python process; a crash (e.g. killed for memory) becomes a failed record."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{cell.id}.log"
    with tempfile.TemporaryDirectory(prefix="liar-cell-") as tmp:
        job, rec = Path(tmp) / "cell.json", Path(tmp) / "record.json"
        job.write_text(json.dumps({"cell": cell.to_json(), "evaluation": evaluation.model_dump(mode="json")}))
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        started, t0 = _now(), time.perf_counter()
        with log_path.open("w") as log:
            proc = subprocess.run(
                [sys.executable, "-m", "core.sweep.run", str(job), str(rec)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        if proc.returncode == 0 and rec.is_file():
            return json.loads(rec.read_text())
        tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
        reason = f"cell process exited with code {proc.returncode}"
        if proc.returncode < 0:
            reason += " (killed by a signal; out of memory?)"
        return {
            "id": cell.id,
            "kind": cell.kind,
            "params": cell.params(),
            "recipe": cell.recipe,
            "status": "failed",
            "metrics": {},
            "summary": {},
            "layers": [],
            "error": reason,
            "traceback": tail,
            "started": started,
            "finished": _now(),
            "seconds": time.perf_counter() - t0,
        }


def read_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """The last record of each cell id in a results.jsonl (unreadable lines, e.g. a cut-off write, skipped)."""
    path = Path(path)
    records: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            records[rec["id"]] = rec
    return records


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record as one JSON line, flushed to disk before returning."""
    line = json.dumps(record, default=_json_default, allow_nan=True) + "\n"
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextlib.contextmanager
def _lock(out: Path) -> Iterator[None]:
    """Refuse to run two sweeps into the same directory at once."""
    import fcntl

    with (out / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another sweep is running into {out}") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class SweepOutcome:
    total: int
    skipped: int
    ran: int
    failed: int
    files: list[Path]


def run_sweep(
    grid: str | Path | Sweep,
    out: str | Path,
    *,
    isolate: bool = False,
    log: Log | None = None,
) -> SweepOutcome:
    """Run every unfinished cell of ``grid`` into ``out``, then write the reports.

    Each record is appended to ``out/results.jsonl`` as soon as its cell finishes, so an interrupted
    sweep loses at most the cell that was running.
    """
    log = log or (lambda msg: print(msg, flush=True))
    sweep = grid if isinstance(grid, Sweep) else load_grid(grid)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / RESULTS
    with _lock(out):
        if not isinstance(grid, Sweep):
            (out / "grid.yaml").write_text(Path(grid).read_text(encoding="utf-8"), encoding="utf-8")
        done = read_records(results)
        todo = [c for c in sweep.cells if done.get(c.id, {}).get("status") != "ok"]
        skipped = len(sweep.cells) - len(todo)
        retry = sum(1 for c in todo if c.id in done)
        log(
            f"{len(sweep.cells)} cells: {skipped} finished earlier, {len(todo)} to run"
            + (f" ({retry} failed before, retrying)" if retry else "")
        )
        failed = 0
        for i, cell in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] {cell.describe()} …")
            evaluation = sweep.spec.evaluation
            record = _run_isolated(cell, evaluation, out) if isolate else run_cell(cell, evaluation)
            append_record(results, record)
            if record["status"] == "ok":
                metric = sweep.spec.evaluation.metric
                value = record["metrics"].get(metric) if metric else None
                shown = f"{metric} {_fmt(value)}" if value is not None else "done"
                log(f"[{i}/{len(todo)}] {cell.describe()}: {shown} ({record['seconds']:.1f} s)")
            else:
                failed += 1
                log(f"[{i}/{len(todo)}] {cell.describe()}: FAILED: {record['error']}")
        files = write_reports(sweep, out)
    log(f"wrote {', '.join(str(f) for f in files)}")
    return SweepOutcome(len(sweep.cells), skipped, len(todo), failed, files)


# --- reports ---------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def _metric_name(sweep: Sweep, records: list[dict[str, Any]]) -> str | None:
    if sweep.spec.evaluation.metric:
        return sweep.spec.evaluation.metric
    for r in records:
        if r.get("status") == "ok" and r.get("metrics"):
            return next(iter(r["metrics"]))
    return None


def write_reports(sweep: Sweep, out: str | Path) -> list[Path]:
    """results.csv, results.md and the plots, from the records of the current grid's cells."""
    out = Path(out)
    records = read_records(out / RESULTS)
    current = [records[c.id] for c in sweep.cells if c.id in records]
    metric = _metric_name(sweep, current)
    files = [_write_csv(sweep, records, out / "results.csv")]
    plots = _write_plots(sweep, records, metric, out / "plots")
    files.append(_write_markdown(sweep, records, metric, plots, out / "results.md"))
    return files + plots


def _write_csv(sweep: Sweep, records: dict[str, dict[str, Any]], path: Path) -> Path:
    metric_keys: list[str] = []
    for c in sweep.cells:
        for k in records.get(c.id, {}).get("metrics", {}):
            if k not in metric_keys:
                metric_keys.append(k)
    summary_keys = [
        "achieved_ratio",
        "params_before",
        "params_after",
        "prune_seconds",
        "reconstruct_seconds",
        "eval_seconds",
        "peak_memory_mb",
        "attn_error_before",
        "attn_error_after",
        "ffn_error_before",
        "ffn_error_after",
    ]
    head = ["id", "kind", "status", "model", "criterion", "reconstruction", "ratio"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(head + metric_keys + summary_keys + ["seconds", "finished", "error"])
    for c in sweep.cells:
        rec = records.get(c.id)
        status = rec["status"] if rec else "pending"
        metrics, summary = (rec or {}).get("metrics", {}), (rec or {}).get("summary", {})
        writer.writerow(
            [c.id, c.kind, status, c.model_label, c.criterion or "", c.reconstruction or "", c.ratio or 0.0]
            + [metrics.get(k, "") for k in metric_keys]
            + [summary.get(k, "") for k in summary_keys]
            + [(rec or {}).get("seconds", ""), (rec or {}).get("finished", ""), (rec or {}).get("error") or ""]
        )
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _value(rec: dict[str, Any] | None, metric: str | None) -> str:
    if rec is None:
        return "–"
    if rec.get("status") != "ok":
        return "failed"
    return _fmt(rec.get("metrics", {}).get(metric)) if metric else "–"


def _write_markdown(
    sweep: Sweep, records: dict[str, dict[str, Any]], metric: str | None, plots: list[Path], path: Path
) -> Path:
    cells = sweep.cells
    status = [records[c.id]["status"] if c.id in records else "pending" for c in cells]
    title = sweep.spec.name or "Sweep results"
    lines = [
        f"# {title}",
        "",
        f"Written {dt.date.today().isoformat()} by `liar sweep`"
        + (f" from `{sweep.source}`" if sweep.source else "")
        + f"; {status.count('ok')} of {len(cells)} cells finished, {status.count('failed')} failed, "
        f"{status.count('pending')} pending. Metric: **{metric or '–'}**. Ratio: the fraction of the "
        "transformer blocks' parameters to remove (target; `results.csv` has the achieved one).",
        "",
    ]
    for model in sweep.models:
        lines += [f"## {model}", "", "| criterion | ratio | " + " | ".join(sweep.methods) + " |"]
        lines.append("|---|---|" + "---|" * len(sweep.methods))
        dense = next((c for c in cells if c.kind == "dense" and c.model_label == model), None)
        if dense is not None:
            blanks = [""] * (len(sweep.methods) - 1)
            lines.append("| dense | 0% | " + " | ".join([_value(records.get(dense.id), metric)] + blanks) + " |")
        for crit in sweep.criteria:
            for ratio in sweep.ratios:
                row = []
                for method in sweep.methods:
                    cell = next(
                        c
                        for c in sweep.prune_cells
                        if (c.model_label, c.criterion, c.reconstruction, c.ratio) == (model, crit, method, ratio)
                    )
                    row.append(_value(records.get(cell.id), metric))
                lines.append(f"| {crit} | {ratio:.0%} | " + " | ".join(row) + " |")
        lines.append("")
    failures = [(c, records[c.id]) for c in cells if c.id in records and records[c.id]["status"] != "ok"]
    if failures:
        lines += ["## Failed cells (retried on the next run)", ""]
        lines += [f"- {c.describe()}: `{(r.get('error') or '').splitlines()[0][:300]}`" for c, r in failures]
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _write_plots(sweep: Sweep, records: dict[str, dict[str, Any]], metric: str | None, folder: Path) -> list[Path]:
    from core.sweep import plots

    files: list[Path] = []
    ok = {c.id: records[c.id] for c in sweep.cells if c.id in records and records[c.id]["status"] == "ok"}
    error_ratio = sweep.spec.plots.error_ratio if sweep.spec.plots.error_ratio is not None else max(sweep.ratios)
    for model in sweep.models:
        dense = next((c for c in sweep.cells if c.kind == "dense" and c.model_label == model and c.id in ok), None)
        dense_value = ok[dense.id]["metrics"].get(metric) if dense is not None and metric else None
        for crit in sweep.criteria:
            cells = [c for c in sweep.prune_cells if c.model_label == model and c.criterion == crit and c.id in ok]
            if not cells:
                continue
            stem = f"{_slug(model)}-{_slug(crit)}"
            if metric and any(metric in ok[c.id]["metrics"] for c in cells):
                series = {
                    m: [(c.ratio, ok[c.id]["metrics"].get(metric)) for c in cells if c.reconstruction == m]
                    for m in sweep.methods
                }
                files.append(
                    plots.metric_vs_ratio(
                        {k: v for k, v in series.items() if v},
                        folder / f"{metric}-vs-ratio-{stem}.png",
                        metric=metric,
                        title=f"{model}, {crit} criterion",
                        dense=dense_value,
                        log_y=sweep.spec.evaluation.log_scale,
                    )
                )
            at_ratio = [c for c in cells if c.ratio == error_ratio and ok[c.id].get("layers")]
            if at_ratio:
                files.append(
                    plots.layer_errors(
                        _error_series(at_ratio, ok),
                        folder / f"layer-errors-{stem}-r{error_ratio:g}.png",
                        title=f"{model}, {crit} criterion, {error_ratio:.0%} removed: per-layer output error",
                    )
                )
    return files


def _error_series(cells: list[Cell], ok: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """error_after per reconstruction, plus the plain-pruning error (the 'none' run, else error_before)."""

    def per_module(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            out.setdefault(r["module"], []).append((r["layer"], r[key]))
        return out

    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    plain = next((c for c in cells if (c.recipe or {}).get("reconstruction", {}).get("method") == "none"), None)
    source = plain or cells[0]
    label = "no reconstruction" if plain else f"no reconstruction (error_before of the {source.reconstruction} run)"
    series[label] = per_module(ok[source.id]["layers"], "error_after" if plain else "error_before")
    for c in cells:
        if c is not plain:
            series[c.reconstruction or "?"] = per_module(ok[c.id]["layers"], "error_after")
    return series


def _child_main(job_path: str, record_path: str) -> int:
    """Entry point of an isolated cell: ``python -m core.sweep.run CELL.json RECORD.json``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    job = json.loads(Path(job_path).read_text())
    cell = Cell(**job["cell"])
    record = run_cell(cell, EvaluationSpec.model_validate(job["evaluation"]))
    Path(record_path).write_text(json.dumps(record, default=_json_default))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:3]))
