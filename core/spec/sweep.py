"""The sweep grid: a base recipe, lists of values to vary and an evaluation, expanded into cells.

A grid file (YAML) looks like::

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
    evaluation:                             # see core.spec.evaluation
      perplexity: {text: eval.txt, seq_len: 512, max_windows: 40, batch_size: 4}   # decoders
      metrics: ["mypkg.tasks:accuracy"]     # callables fn(model, tokenizer, **options) -> {name: value}
      metric: perplexity                    # the metric of the tables and plots (default: perplexity)
    dense: true                             # also evaluate each unpruned model (the baseline row)
    plots: {error_ratio: 0.5}               # the ratio of the per-layer error plot (default: the largest)

Axes left out of ``grid`` take the base recipe's value. Relative paths are relative to the working
directory, as for ``liar prune``.

Every cell (one model × criterion × reconstruction × ratio, or one dense baseline) is a resolved
:class:`~core.spec.recipe.Recipe` plus the evaluation; its id is a hash of those (recipe fields left at their
default values do not enter it), prefixed with readable labels, so changing the base recipe or the
evaluation changes every id.

The whole grid is validated before anything runs: unknown keys, empty or duplicated axis values,
ratios outside (0, 1), unimportable metric callables, and every cell's recipe through ``Recipe``'s own
validation. :func:`expand_grid` is the same expansion without a grid file (the job service's sweeps).
Running cells is ``core.sweep``'s business; this module is torch-free.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.spec.errors import validation_lines
from core.spec.evaluation import EvaluationSpec, MetricSpec, PerplexityEval, resolve_callable
from core.spec.recipe import Recipe

__all__ = [
    "AXES",
    "TOP_KEYS",
    "Cell",
    "CriterionEntry",
    "EvaluationSpec",
    "GridAxes",
    "GridError",
    "MetricSpec",
    "ModelEntry",
    "PerplexityEval",
    "PlotSpec",
    "ReconstructionEntry",
    "Sweep",
    "SweepSpec",
    "expand_grid",
    "load_grid",
    "parse_grid",
    "resolve_callable",
    "slug",
]

AXES = ("model", "criterion", "reconstruction", "ratio")
TOP_KEYS = ("name", "base", "grid", "evaluation", "dense", "plots")


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
    allocation: Literal["auto", "uniform", "global"] | None = Field(None, description="overrides the base recipe's")
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


class PlotSpec(_Strict):
    error_ratio: float | None = Field(None, description="ratio of the per-layer error plot (default: the largest)")


class SweepSpec(_Strict):
    name: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    grid: GridAxes = Field(default_factory=GridAxes)
    evaluation: EvaluationSpec
    dense: bool = True
    plots: PlotSpec = Field(default_factory=PlotSpec)


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


def slug(text: str) -> str:
    """A short file-name-safe form of a label."""
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


# --- expansion -------------------------------------------------------------------------------------
@dataclass
class _Axes:
    """The grid's axes with the base recipe's values filled in, each entry paired with its label."""

    models: list[tuple[ModelEntry, str]]
    criteria: list[tuple[CriterionEntry, str]]
    methods: list[tuple[ReconstructionEntry, str]]
    ratios: list[float]

    def labels(self, axis: str) -> list[str]:
        return [label for _, label in getattr(self, axis)]


def _base_criterion(base: dict[str, Any]) -> CriterionEntry:
    crit = base.get("criterion", {"name": "magnitude"})
    if isinstance(crit, str):
        return CriterionEntry(name=crit)
    try:
        return CriterionEntry.model_validate(crit)
    except ValidationError as exc:
        raise GridError(validation_lines(exc, root="criterion", prefix="base.criterion.")) from None


def _resolve_axes(g: GridAxes, base: dict[str, Any]) -> _Axes:
    """Each axis from the grid, else from the base recipe; raises GridError if a model or ratio is missing."""
    models = g.model or ([ModelEntry(path=str(base["model"]))] if "model" in base else [])
    if not models:
        raise GridError(["grid.model: no model: list models in grid.model or set base.model"])
    criteria = g.criterion or [_base_criterion(base)]
    if g.reconstruction:
        methods = g.reconstruction
    else:
        rec = base.get("reconstruction", {"method": "liar"})
        methods = [ReconstructionEntry(method=rec.get("method", "liar") if isinstance(rec, dict) else str(rec))]
    if g.ratio:
        ratios = list(g.ratio)
    elif "ratio" in base:
        ratios = [base["ratio"]]
    else:
        raise GridError(["grid.ratio: no ratio: list ratios in grid.ratio or set base.ratio"])
    model_labels = _unique_labels([m.label or Path(m.path.rstrip("/")).name or m.path for m in models])
    return _Axes(
        models=list(zip(models, model_labels)),
        criteria=[(c, _criterion_label(c)) for c in criteria],
        methods=[(r, _method_label(r)) for r in methods],
        ratios=ratios,
    )


def _axis_problems(axes: _Axes) -> list[str]:
    problems = []
    for axis, field in (("model", "models"), ("criterion", "criteria"), ("reconstruction", "methods")):
        labels = axes.labels(field)
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            problems.append(f"grid.{axis}: duplicated entries {dupes} (give each a distinct 'label' if intended)")
    if len({m.path for m, _ in axes.models}) != len(axes.models):
        problems.append("grid.model: the same model is listed twice")
    return problems


def _cell_recipe(
    base: dict[str, Any], model: ModelEntry, crit: CriterionEntry, method: ReconstructionEntry, ratio: float
) -> dict[str, Any]:
    """The base recipe with one value of each axis put in (unvalidated)."""
    data = json.loads(json.dumps(base))  # deep copy
    data.update(model=model.path, ratio=ratio)
    data["criterion"] = {"name": crit.name, "options": crit.options}
    if crit.allocation is not None:
        data["allocation"] = crit.allocation
    rec = data.get("reconstruction")
    rec = dict(rec) if isinstance(rec, dict) else {}
    rec["method"] = method.method
    if method.damp is not None:
        rec["damp"] = method.damp
    data["reconstruction"] = rec
    return data


def _dense_cell(model: ModelEntry, model_label: str, dtype: str, device: str, evaluation: Any) -> Cell:
    payload = {"dense": model.path, "dtype": dtype, "device": device, "evaluation": evaluation}
    return Cell(
        id=f"{slug(model_label)}-dense-{_digest(payload)}",
        kind="dense",
        model=model.path,
        model_label=model_label,
        dtype=dtype,
        device=device,
    )


def _prune_cell(data: dict[str, Any], labels: tuple[str, str, str], ratio: float, evaluation: Any) -> Cell:
    """The cell of one validated recipe; raises pydantic's ValidationError."""
    recipe = Recipe.model_validate(data)
    model_label, crit_label, method_label = labels
    payload = {"recipe": recipe.model_dump(mode="json", exclude_defaults=True), "evaluation": evaluation}
    name = f"{slug(model_label)}-{slug(crit_label)}-{slug(method_label)}-r{ratio:g}"
    return Cell(
        id=f"{name}-{_digest(payload)}",
        kind="prune",
        model=data["model"],
        model_label=model_label,
        criterion=crit_label,
        reconstruction=method_label,
        ratio=ratio,
        recipe=recipe.model_dump(mode="json"),
        dtype=str(data.get("dtype", "auto")),
        device=str(data.get("device", "auto")),
    )


MAX_CELLS = 1_000  # cells of one grid (each a pruning run)


def _expand(base: dict[str, Any], axes: _Axes, evaluation: Any, dense: bool) -> list[Cell]:
    """Every cell in run order: per model, its dense baseline, then criterion × ratio × reconstruction.

    Every recipe is validated; a problem shared by several cells is reported once, naming the first.
    """
    size = len(axes.models) * (len(axes.criteria) * len(axes.ratios) * len(axes.methods) + int(dense))
    if size > MAX_CELLS:
        raise GridError([f"grid: {size} cells exceed the limit of {MAX_CELLS}; split the sweep"])
    cells: list[Cell] = []
    cell_errors: dict[str, list[str]] = {}
    dtype, device = str(base.get("dtype", "auto")), str(base.get("device", "auto"))
    for model, model_label in axes.models:
        if dense:
            cells.append(_dense_cell(model, model_label, dtype, device, evaluation))
        for (crit, crit_label), ratio, (method, method_label) in itertools.product(
            axes.criteria, axes.ratios, axes.methods
        ):
            data = _cell_recipe(base, model, crit, method, ratio)
            try:
                cells.append(_prune_cell(data, (model_label, crit_label, method_label), ratio, evaluation))
            except ValidationError as exc:
                where = f"{model_label} / {crit_label} / {method_label} / ratio {ratio:g}"
                for line in validation_lines(exc, prefix="recipe."):
                    cell_errors.setdefault(line, []).append(where)
    if cell_errors:
        lines = []
        for msg, where in cell_errors.items():
            more = f" and {len(where) - 1} more" if len(where) > 1 else ""
            lines.append(f"{msg} (cell {where[0]}{more})")
        raise GridError(lines)
    return cells


def expand_grid(base: dict[str, Any], grid: dict[str, Any] | None = None) -> list[Cell]:
    """The pruning cells of ``base`` (a recipe mapping) × ``grid`` (axes as in a grid file's ``grid``).

    The expansion and checks of :func:`parse_grid`, without an evaluation or dense baselines (cell ids
    then hash the recipe alone); raises :class:`GridError`.
    """
    try:
        axes = GridAxes.model_validate(grid or {})
    except ValidationError as exc:
        raise GridError(validation_lines(exc, root="grid", prefix="grid.")) from None
    resolved = _resolve_axes(axes, base)
    problems = _axis_problems(resolved)
    if problems:
        raise GridError(problems)
    return _expand(dict(base), resolved, evaluation=None, dense=False)


# --- the grid file --------------------------------------------------------------------------------
def _validate_spec(data: Any, source: str) -> SweepSpec:
    """The top-level keys and axis names, then the schema; every problem at once."""
    if not isinstance(data, dict):
        raise GridError([f"{source}: a grid file must be a YAML mapping with keys {', '.join(TOP_KEYS)}"])
    problems = [f"{k}: unknown key; a grid file has {', '.join(TOP_KEYS)}" for k in data if k not in TOP_KEYS]
    known = {k: v for k, v in data.items() if k in TOP_KEYS}
    grid = data.get("grid")
    if isinstance(grid, dict):
        problems += [
            f"grid.{k}: unknown axis; a grid varies {', '.join(AXES)} (fix other recipe fields in 'base')"
            for k in grid
            if k not in AXES
        ]
        known["grid"] = {k: v for k, v in grid.items() if k in AXES}
    try:
        spec = SweepSpec.model_validate(known)
    except ValidationError as exc:
        raise GridError(problems + validation_lines(exc, root="grid")) from None
    if problems:
        raise GridError(problems)
    return spec


def _load_base(base: dict[str, Any] | str) -> dict[str, Any]:
    """The base recipe mapping, read from its YAML file if ``base`` is a path."""
    if isinstance(base, dict):
        return dict(base)
    path = Path(base).expanduser()
    if not path.is_file():
        raise GridError([f"base: recipe file {base!r} does not exist"])
    try:
        return Recipe.parse_yaml(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # bad YAML, or not a mapping: the recipe reader's sentence
        raise GridError([f"base: {str(path)!r}: {exc}"]) from None


def parse_grid(data: Any, source: str = "<grid>") -> Sweep:
    """Validate a grid (already parsed YAML) and expand it into cells; raises :class:`GridError`."""
    spec = _validate_spec(data, source)
    base = _load_base(spec.base)
    axes = _resolve_axes(spec.grid, base)
    problems = _axis_problems(axes)
    error_ratio = spec.plots.error_ratio
    if error_ratio is not None and error_ratio not in axes.ratios:
        problems.append(f"plots.error_ratio: {error_ratio} is not one of the grid's ratios {axes.ratios}")
    if problems:
        raise GridError(problems)
    evaluation = spec.evaluation.model_dump(mode="json", exclude_defaults=True)
    cells = _expand(base, axes, evaluation, spec.dense)
    return Sweep(
        spec,
        cells,
        axes.labels("models"),
        axes.labels("criteria"),
        axes.labels("methods"),
        list(axes.ratios),
        source,
    )


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
