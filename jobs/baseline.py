"""The dense model's perplexity beside a pruned one's: the baseline of the paper's figures.

A job that evaluates perplexity also records ``perplexity_dense``, the unpruned model's perplexity
on the same text, windows and dtype. It is measured once — by ``core.evaluate``, which reads the model's
own checkpoint block by block when it would not fit beside the pruned one — and later jobs on the
same model and text copy it from the job that measured it (a 70B model's dense evaluation is not
repeated per ratio).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from jobs.db import Job, Metric, Status

DENSE = "perplexity_dense"


def window_args(ev: dict[str, Any]) -> dict[str, Any]:
    """The windowing of a stored perplexity evaluation (``core.spec.evaluation.JobEvaluation``)."""
    return {
        "seq_len": int(ev.get("seq_len", 512)),
        "batch_size": int(ev.get("batch_size", 4)),  # absent from jobs stored before it was accepted
        "max_windows": ev.get("max_windows"),
    }


def _key(recipe: dict[str, Any], ev: dict[str, Any]) -> tuple:
    """What the dense perplexity depends on: the model, its dtype, the text and the windows."""
    args = window_args(ev)
    model, dtype = recipe.get("model"), recipe.get("dtype", "auto")
    return model, dtype, str(ev.get("dataset")), args["seq_len"], args["max_windows"]


def last_perplexity(evaluations: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The evaluation a job's ``perplexity`` metrics come from (the last one: later ones overwrite)."""
    return next((e for e in reversed(evaluations or []) if e.get("type") == "perplexity"), None)


def known(sf, recipe: dict[str, Any], ev: dict[str, Any]) -> tuple[float, int] | None:
    """(dense perplexity, id of the job that has it) from the newest succeeded job that recorded it
    for the same model, dtype, text and windows; None if none did."""
    key = _key(recipe, ev)
    with sf() as s:
        rows = s.execute(
            select(Job.id, Job.recipe, Job.evaluations, Metric.value)
            .join(Metric, Metric.job_id == Job.id)
            .where(Metric.name == DENSE, Job.status == Status.SUCCEEDED.value)
            .order_by(Job.id.desc())
        ).all()
    for job_id, job_recipe, evaluations, value in rows:
        last = last_perplexity(evaluations)
        if last is not None and _key(job_recipe, last) == key:
            return value, job_id
    return None


def measure(result, ev: dict[str, Any]) -> float:
    """The unpruned model's perplexity on ``ev``'s text, with the pruned run's tokenizer, device and
    dtype (``core.evaluate`` reads it block by block unless it fits beside the pruned one)."""
    from core.evaluation.run import evaluate

    recipe = result.recipe
    spec = {**ev, "type": "perplexity"}
    out = evaluate(recipe.model, spec, tokenizer=result.tokenizer, device=recipe.device, dtype=recipe.dtype)
    return out["perplexity"]
