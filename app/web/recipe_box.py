"""The New-run tab's recipe box: a recipe, or a sweep grid, pasted or edited as YAML and submitted.

What "Validate" writes there is what "Submit this YAML" submits: one job's recipe, or for a sweep the
grid of ``liar sweep``'s files (``base`` plus ``grid`` lists of ratios, reconstruction methods and
criteria; core/spec/sweep.py), so editing the YAML of a sweep and submitting it queues every job of
it. The form's evaluation boxes give the evaluations either way.
"""

from __future__ import annotations

from typing import Any

from app.web.fields import FieldError
from app.web.forms import Status, evaluations_for, shown, task_evaluation
from core.spec.recipe import Recipe
from jobs.access import OPEN, Actor
from jobs.service import JobService, QueueError, SubmitError

GRID_AXES = {"ratio": "ratios", "reconstruction": "methods", "criterion": "criteria"}  # web sweeps' axes


def _axis(name: str, values: Any) -> list:
    """A grid axis as the job service's sweep takes it: a list of plain values (a method or criterion
    by its name)."""
    values = values if isinstance(values, list) else [values]
    plain = []
    for v in values:
        key = {"reconstruction": "method", "criterion": "name"}.get(name)
        if isinstance(v, dict) and key and set(v) <= {key}:
            v = v[key]
        if isinstance(v, (dict, list)):
            raise FieldError(
                "recipe",
                f"grid.{name}: give plain values here ({v!r} is not); options go in base, the same for every job",
            )
        plain.append(v)
    if not plain:
        raise FieldError("recipe", f"grid.{name} is empty")
    return plain


def parse_grid(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list]]:
    """(base recipe, {"ratios" | "methods" | "criteria": values}) of a grid document."""
    unknown = sorted(set(data) - {"name", "base", "grid"})
    if unknown:
        raise FieldError(
            "recipe",
            f"a sweep from this box has name, base and grid only, not {', '.join(unknown)} (the form's boxes "
            "set the evaluations)",
        )
    base, grid = data.get("base"), data.get("grid")
    if not isinstance(base, dict) or not isinstance(grid, dict) or not grid:
        raise FieldError("recipe", "a sweep needs base: (a recipe) and grid: (the lists to vary)")
    other = sorted(set(grid) - set(GRID_AXES))
    if other:
        raise FieldError(
            "recipe",
            f"a web sweep varies {', '.join(GRID_AXES)}; grid.{other[0]} needs `liar sweep` on the command line",
        )
    axes = {GRID_AXES[name]: _axis(name, values) for name, values in grid.items()}
    if "ratios" in axes and "ratio" not in base and "target" not in base:
        base = {**base, "ratio": axes["ratios"][0]}  # the base is validated as a recipe of its own first
    return base, axes


def submit(
    service: JobService,
    text: str,
    evaluate: str | None,
    user: str | None,
    tasks=None,
    task_dir=None,
    actor: Actor = OPEN,
) -> Status | str:
    """Submit the box's recipe (one job) or grid (a sweep) with the form's evaluations; the status line."""
    if not text or not text.strip():
        return shown(FieldError("recipe", "the recipe box is empty: validate the form or paste a recipe"))
    try:
        data = Recipe.parse_yaml(text)  # parsed once, here; the service validates the mapping
        grid = "grid" in data or "base" in data
        base, axes = parse_grid(data) if grid else (data, {})
        calibration = base.get("calibration") if isinstance(base.get("calibration"), dict) else {}
        evals = evaluations_for(evaluate, calibration.get("max_seq_length", 128)) + task_evaluation(tasks, task_dir)
        if not grid:
            job_id = service.submit(base, submitted_by=user or None, evaluations=evals, confine=True, actor=actor)
            return f"✓ submitted job {job_id}"
        group, ids = service.submit_sweep(
            base, **axes, submitted_by=user or None, evaluations=evals, confine=True, actor=actor
        )
    except (SubmitError, QueueError) as exc:
        return shown(exc)
    except (ValueError, TypeError) as exc:  # the YAML itself, or a max_seq_length that is no number
        return shown(FieldError("recipe", f"invalid recipe: {exc}"))
    return f"✓ submitted sweep {group} of {len(ids)} jobs: jobs {', '.join(map(str, ids))}"
