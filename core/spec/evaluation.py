"""What to measure after pruning: one perplexity schema, read in the two formats that name it.

:class:`PerplexityEval` holds the fields and checks both share (a named set or an existing file,
``seq_len > 1``, positive ``max_windows`` and ``batch_size``). Two outer formats are built on it:

- a job's evaluation (:class:`JobEvaluation`), one entry of the job service's ``evaluations`` list::

      {"type": "perplexity", "dataset": "wikitext2", "seq_len": 512, "max_windows": 40}

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
