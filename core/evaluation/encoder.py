"""Evaluating encoders on their tasks: sequence classification, STS-style regression and extractive QA.

Metrics are in :mod:`core.evaluation.metrics`, task data loaders in :mod:`core.evaluation.task_data`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from core.evaluation.metrics import accuracy, normalize_answer, pearson, spearman, squad_metrics
from core.kernels.cpu_matmul import route_linears


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _model_inputs(enc: Mapping[str, Any], rows: slice, device: torch.device) -> dict[str, torch.Tensor]:
    keys = ("input_ids", "attention_mask", "token_type_ids")
    return {k: torch.as_tensor(enc[k][rows]).to(device) for k in keys if k in enc}


def _class_index(label: Any, label2id: Mapping[str, int], n_labels: int, index: int) -> int:
    if isinstance(label, bool):
        label = int(label)
    if isinstance(label, float) and label.is_integer():
        label = int(label)
    if isinstance(label, int):
        if not 0 <= label < n_labels:
            raise ValueError(f"record {index}: the label is outside the model's {n_labels} classes")
        return label
    if isinstance(label, str):
        lookup = {str(k).lower(): v for k, v in label2id.items()}
        if label.lower() in lookup:
            return int(lookup[label.lower()])
    raise ValueError(f"record {index}: the label is not a class index or a name in label2id {dict(label2id)}")


@torch.no_grad()
def evaluate_classifier(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    batch_size: int = 32,
    max_length: int = 128,
    return_predictions: bool = False,
) -> dict[str, Any]:
    """Score a sequence classifier (or a one-output regressor) on ``records``.

    Classifiers: ``{"accuracy", "n"}`` (the argmax of the logits against the label; label names
    are mapped through ``config.label2id``). Regressors (``num_labels == 1``): ``{"spearman",
    "pearson", "n"}`` between the single output and the float label. Texts longer than
    ``max_length`` tokens are truncated (pairs: the longer side first).
    """
    if not records:
        raise ValueError("no records to evaluate")
    config = model.config
    regression = config.num_labels == 1 or getattr(config, "problem_type", None) == "regression"
    labels: list[Any] = []
    for i, rec in enumerate(records, 1):
        if "text" not in rec or "label" not in rec:
            raise ValueError(f"record {i} needs 'text' and 'label'")
        if regression:
            labels.append(float(rec["label"]))
        else:
            labels.append(_class_index(rec["label"], config.label2id or {}, config.num_labels, i))
    paired = any(rec.get("text_pair") is not None for rec in records)
    if paired and not all(rec.get("text_pair") is not None for rec in records):
        raise ValueError("either every record or none has a 'text_pair'")
    model.eval()
    device = _device_of(model)
    outputs: list[float] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        enc = tokenizer(
            [str(r["text"]) for r in chunk],
            [str(r["text_pair"]) for r in chunk] if paired else None,
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        with route_linears(model, device):
            logits = model(**_model_inputs(enc, slice(None), device)).logits.float()
        outputs.extend(logits[:, 0].tolist() if regression else logits.argmax(-1).tolist())
    if regression:
        result: dict[str, Any] = {
            "spearman": spearman(outputs, labels),
            "pearson": pearson(outputs, labels),
            "n": len(labels),
        }
    else:
        result = {"accuracy": accuracy(outputs, labels), "n": len(labels)}
    if return_predictions:
        result["predictions"] = outputs
    return result


def _best_span(
    start_logits: Sequence[float],
    end_logits: Sequence[float],
    offsets: Sequence[tuple[int, int] | None],
    n_best: int,
    max_answer_length: int,
) -> tuple[float, int, int] | None:
    """Highest ``start + end`` logit span inside the context (``offsets`` None outside), or None."""
    in_context = [i for i, o in enumerate(offsets) if o is not None]
    if not in_context:
        return None
    starts = sorted(in_context, key=lambda i: start_logits[i], reverse=True)[:n_best]
    ends = sorted(in_context, key=lambda i: end_logits[i], reverse=True)[:n_best]
    best = None
    for s in starts:
        for e in ends:
            if e < s or e - s + 1 > max_answer_length:
                continue
            score = start_logits[s] + end_logits[e]
            if best is None or score > best[0]:
                best = (score, s, e)
    return best


@torch.no_grad()
def _best_spans(enc, tokenizer, start_all, end_all, context_seq: int, n_best: int, max_answer_length: int):
    """Per example: the best span over its windows ``(score, feature, start, end)`` and the minimum
    null ([CLS]) score over its windows."""
    best: dict[int, tuple[float, int, int, int]] = {}  # example → (score, feature, start, end)
    null: dict[int, float] = {}
    for f in range(len(enc["input_ids"])):
        ex = enc["overflow_to_sample_mapping"][f]
        seq_ids = enc.sequence_ids(f)
        offsets = [o if seq_ids[k] == context_seq else None for k, o in enumerate(enc["offset_mapping"][f])]
        ids = enc["input_ids"][f]
        cls = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else 0
        null[ex] = min(null.get(ex, math.inf), start_all[f][cls] + end_all[f][cls])
        span = _best_span(start_all[f], end_all[f], offsets, n_best, max_answer_length)
        if span is not None and (ex not in best or span[0] > best[ex][0]):
            best[ex] = (span[0], f, span[1], span[2])
    return best, null


def evaluate_qa(
    model: torch.nn.Module,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    batch_size: int = 16,
    max_length: int = 384,
    doc_stride: int = 128,
    max_answer_length: int = 30,
    n_best: int = 20,
    version_2: bool | None = None,
    null_score_diff_threshold: float = 0.0,
    return_predictions: bool = False,
) -> dict[str, Any]:
    """Extractive QA: decode answer spans from start/end logits and score them SQuAD-style.

    Long contexts are cut into windows of ``max_length`` tokens overlapping by ``doc_stride``
    tokens. In every window, the ``n_best`` highest start and end logits inside the context form
    candidate spans (end not before start, at most ``max_answer_length`` tokens); the best
    ``start + end`` score over all windows wins, and its text is cut from the context through the
    fast tokenizer's offset mapping. ``version_2`` (default: whether any record is unanswerable)
    answers the empty string when the null score — start and end logits of the [CLS] token, its
    minimum over the windows — exceeds the best span's score by more than
    ``null_score_diff_threshold``. Returns :func:`squad_metrics` (+ ``predictions`` on request).
    """
    if not records:
        raise ValueError("no records to evaluate")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("extractive QA decoding needs a fast tokenizer (it reads character offsets)")
    for i, rec in enumerate(records, 1):
        missing = [k for k in ("id", "question", "context", "answers") if k not in rec]
        if missing:
            raise ValueError(f"QA record {i} has no field {missing[0]!r}")
    if not 0 <= doc_stride < max_length // 2:
        raise ValueError(f"doc_stride ({doc_stride}) must be below half of max_length ({max_length}), e.g. a quarter")
    if version_2 is None:
        version_2 = any(not any(normalize_answer(a) for a in rec["answers"]) for rec in records)
    pad_right = tokenizer.padding_side == "right"  # question first, unless the tokenizer pads on the left
    questions = [str(r["question"]).lstrip() for r in records]
    contexts = [str(r["context"]) for r in records]
    enc = tokenizer(
        questions if pad_right else contexts,
        contexts if pad_right else questions,
        truncation="only_second" if pad_right else "only_first",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="longest",
    )
    n_features = len(enc["input_ids"])
    model.eval()
    device = _device_of(model)
    start_all: list[list[float]] = []
    end_all: list[list[float]] = []
    for lo in range(0, n_features, batch_size):
        with route_linears(model, device):
            out = model(**_model_inputs(enc, slice(lo, lo + batch_size), device))
        start_all.extend(out.start_logits.float().tolist())
        end_all.extend(out.end_logits.float().tolist())
    best, null = _best_spans(enc, tokenizer, start_all, end_all, 1 if pad_right else 0, n_best, max_answer_length)
    predictions: dict[str, str] = {}
    for ex, rec in enumerate(records):
        text = ""
        if ex in best:
            score, f, s, e = best[ex]
            if not (version_2 and null[ex] > score + null_score_diff_threshold):
                offsets = enc["offset_mapping"][f]
                text = contexts[ex][offsets[s][0] : offsets[e][1]]
        predictions[str(rec["id"])] = text
    result: dict[str, Any] = squad_metrics(predictions, records)
    result["version_2"] = version_2
    if return_predictions:
        result["predictions"] = predictions
    return result
