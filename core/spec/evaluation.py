"""What to measure after pruning: one perplexity schema, read in the two formats that name it.

:class:`PerplexityEval` holds the fields and checks both share (a named set or an existing file,
``seq_len > 1``, positive ``max_windows`` and ``batch_size``). Two outer formats are built on it:

- a job's evaluation (:class:`JobEvaluation`), one entry of the job service's ``evaluations`` list::

      {"type": "perplexity", "dataset": "wikitext2", "seq_len": 512, "max_windows": 40}

  (a job may also run lm-eval tasks: :class:`TasksJobEvaluation`, ``{"type": "lm_eval", "tasks": [...]}``)

- a sweep grid's ``evaluation`` (:class:`EvaluationSpec`)::

      evaluation:
        perplexity: {text: eval.txt, seq_len: 512, max_windows: 40, batch_size: 4}
        metrics: ["mypkg.tasks:accuracy"]   # callables fn(model, tokenizer, **options) -> {name: value}
        metric: perplexity                  # the metric of the tables and plots

Torch-free, like the rest of ``core.spec``: the measuring itself is in ``core.evaluation``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.spec.recipe import MAX_BATCH, MAX_SAMPLES, MAX_SEQ_LEN, NAMED_DATASETS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PerplexityEval(_Strict):
    """Perplexity over consecutive windows of a text (``core.evaluation.perplexity.perplexity``)."""

    text: str = Field(..., description=f"a named set {NAMED_DATASETS} or a local .txt / .jsonl / .json file")
    seq_len: int = Field(512, ge=2, le=MAX_SEQ_LEN, description="tokens per window")
    max_windows: int | None = Field(None, gt=0, le=MAX_SAMPLES, description="evaluate at most this many windows")
    batch_size: int = Field(4, gt=0, le=MAX_BATCH, description="windows per forward pass")

    @field_validator("text")
    @classmethod
    def _exists(cls, v: str) -> str:
        if v not in NAMED_DATASETS and not Path(v).expanduser().is_file():
            raise ValueError(f"{v!r} is neither a named set {NAMED_DATASETS} nor an existing file")
        return v


class JobEvaluation(PerplexityEval):
    """One evaluation of a job: the perplexity fields, the text named ``dataset``, and a ``type``.

    ``model_dump(by_alias=True)`` is the stored payload that ``jobs.tasks`` reads.
    """

    type: Literal["perplexity"] = "perplexity"
    text: str = Field(
        ..., alias="dataset", description=f"a named set {NAMED_DATASETS} or a local .txt / .jsonl / .json file"
    )


class TasksJobEvaluation(_Strict):
    """lm-eval tasks after pruning (``core.evaluation.lmeval``; block by block after a streamed run):
    ``{"type": "lm_eval", "tasks": ["piqa", "arc_easy"], "limit": 500}``. Names are checked against
    the task registry (and ``task_dir``'s local YAMLs) at submission, by the job service."""

    type: Literal["lm_eval"] = "lm_eval"
    tasks: list[str] = Field(..., min_length=1, description="lm-eval task names (registry, or YAMLs in task_dir)")
    task_dir: str | None = Field(None, description="a directory of local task YAMLs")
    limit: int | float | None = Field(None, gt=0, description="examples per task: a count, or a fraction below 1")
    num_fewshot: int | None = Field(None, ge=0, le=64, description="few-shot examples per prompt")
    batch_size: int = Field(8, gt=0, le=MAX_BATCH, description="requests per forward pass")

    @field_validator("tasks", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        names = v.split(",") if isinstance(v, str) else v
        if not isinstance(names, list):
            return v
        out = []
        for name in (str(n).strip() for n in names):
            if name and name not in out:
                out.append(name)
        return out

    @field_validator("limit")
    @classmethod
    def _limit(cls, v: int | float | None) -> int | float | None:
        if isinstance(v, float) and v >= 1:
            if not v.is_integer():
                raise ValueError("a count of examples must be a whole number (or a fraction below 1)")
            return int(v)
        return v

    @field_validator("task_dir")
    @classmethod
    def _is_dir(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).expanduser().is_dir():
            raise ValueError(f"task directory {v!r} does not exist")
        return v


JOB_EVALUATION_TYPES = {"perplexity": JobEvaluation, "lm_eval": TasksJobEvaluation}


def job_evaluation(data: Any) -> dict[str, Any]:
    """One entry of a job's ``evaluations``, validated, as stored (raises ``ValueError`` /
    ``pydantic.ValidationError``); an entry without ``type`` is a perplexity evaluation."""
    if not isinstance(data, dict):
        raise ValueError(f"an evaluation is a mapping with a 'type', not {type(data).__name__}")
    kind = data.get("type", "perplexity")
    schema = JOB_EVALUATION_TYPES.get(kind)
    if schema is None:
        raise ValueError(f"unknown evaluation type {kind!r}: one of {', '.join(JOB_EVALUATION_TYPES)}")
    return schema.model_validate(data).model_dump(by_alias=True)


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


class MetricSpec(_Strict):
    callable: str = Field(..., description="'package.module:function' → fn(model, tokenizer, **options) -> dict")
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("callable")
    @classmethod
    def _importable(cls, v: str) -> str:
        resolve_callable(v)
        return v


class EvaluationSpec(_Strict):
    """A sweep grid's ``evaluation``: perplexity and/or metric callables, and the metric to tabulate."""

    perplexity: PerplexityEval | None = None
    metrics: list[MetricSpec] = Field(default_factory=list)
    metric: str | None = Field(None, description="the metric of the tables and plots")
    log_scale: bool | None = Field(None, description="log-scale metric axis (default: for perplexity)")

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, v: Any) -> Any:
        if v is None:
            return []
        return [{"callable": x} if isinstance(x, str) else x for x in (v if isinstance(v, list) else [v])]

    @model_validator(mode="after")
    def _something(self) -> EvaluationSpec:
        if self.perplexity is None and not self.metrics:
            raise ValueError("evaluation needs 'perplexity' and/or 'metrics'")
        if self.metric is None and self.perplexity is not None:
            self.metric = "perplexity"
        return self
