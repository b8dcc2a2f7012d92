"""Task metrics for encoders: sequence classification, STS-style regression and extractive QA.

Metrics (all fractions in [0, 1], or correlations in [-1, 1], never percentages):

- classification: ``accuracy``;
- regression (a model with one output, e.g. STS-B): ``spearman`` — the Pearson correlation of the
  ranks, ties given their average rank — and ``pearson``, both computed here in plain Python;
- extractive QA: SQuAD ``exact_match`` and ``f1`` with the official answer normalisation (lower
  case, punctuation removed, articles *a/an/the* removed, whitespace collapsed), each the maximum
  over the gold answers. SQuAD v2 adds unanswerable questions: their only gold answer is the empty
  string, so an empty prediction scores 1 on both metrics and anything else 0.

Data: GLUE and SQuAD through ``datasets`` when the Hugging Face Hub is reachable
(:func:`load_glue`, :func:`load_squad`), or local CSV / JSONL / JSON files
(:func:`read_classification_file`, :func:`read_qa_file`). Records are plain dicts:
classification ``{"text", "text_pair" (optional), "label"}``, QA ``{"id", "question", "context",
"answers": [str, ...]}`` (an empty list marks an unanswerable question).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from core.data.texts import read_rows

# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def accuracy(predictions: Sequence[Any], labels: Sequence[Any]) -> float:
    """Fraction of positions where the prediction equals the label."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("accuracy of an empty set")
    return sum(p == y for p, y in zip(predictions, labels)) / len(labels)


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``values``; a group of equal values shares the mean of the ranks it spans."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        stop = start
        while stop + 1 < len(order) and values[order[stop + 1]] == values[order[start]]:
            stop += 1
        shared = (start + stop) / 2 + 1  # mean of the 1-based ranks start+1 .. stop+1
        for k in range(start, stop + 1):
            ranks[order[k]] = shared
        start = stop + 1
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; NaN when either side is constant (the correlation is undefined)."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} values against {len(y)}")
    if len(x) < 2:
        raise ValueError("a correlation needs at least two points")
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = math.fsum((a - mx) ** 2 for a in x)
    syy = math.fsum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson on average ranks (the tie-correct definition)."""
    return pearson(average_ranks(x), average_ranks(y))


_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation: lower case, drop punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 of the normalised strings; if either is empty, 1.0 only when both are."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """``(exact_match, f1)`` of one prediction: the best over the gold answers ([] → unanswerable)."""
    golds = [a for a in answers if normalize_answer(a)] or [""]
    return max(exact_match(prediction, g) for g in golds), max(token_f1(prediction, g) for g in golds)


def squad_metrics(predictions: Mapping[str, str], records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Mean ``exact_match`` / ``f1`` over ``records`` (``{"id", "answers"}``), split by answerability.

    With unanswerable questions present, also ``has_answer_*`` and ``no_answer_*`` (the latter's
    exact match is the fraction of unanswerable questions answered with the empty string).
    """
    rows: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i, rec in enumerate(records, 1):
        qid = str(rec["id"])
        if qid not in predictions:
            raise ValueError(f"no prediction for question {qid!r} (record {i})")
        answerable = any(normalize_answer(a) for a in rec["answers"])
        rows[answerable].append(squad_scores(predictions[qid], rec["answers"]))
    every = rows[True] + rows[False]
    if not every:
        raise ValueError("no QA records to score")
    out = {
        "exact_match": math.fsum(e for e, _ in every) / len(every),
        "f1": math.fsum(f for _, f in every) / len(every),
        "n": len(every),
    }
    if rows[False]:
        for key, part in (("has_answer", rows[True]), ("no_answer", rows[False])):
            out[f"{key}_n"] = len(part)
            if part:
                out[f"{key}_exact_match"] = math.fsum(e for e, _ in part) / len(part)
                out[f"{key}_f1"] = math.fsum(f for _, f in part) / len(part)
    return out


# --------------------------------------------------------------------------------------------
# Data: GLUE / SQuAD through `datasets`, or local files
# --------------------------------------------------------------------------------------------

GLUE_FIELDS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
"""GLUE task → (text field, pair field) in the ``glue`` dataset; STS-B's label is a float score."""


def _load_dataset(*args: Any, **kwargs: Any):
    try:
        import datasets

        return datasets.load_dataset(*args, **kwargs)
    except Exception as exc:
        raise RuntimeError(
            f"could not load {args[0]!r} through `datasets` ({type(exc).__name__}: {exc}). Without access to the "
            "Hugging Face Hub, pass a local CSV / JSONL / JSON file instead."
        ) from exc


def load_glue(task: str, split: str = "validation") -> list[dict[str, Any]]:
    """GLUE records ``{"text", "text_pair"?, "label"}`` (MNLI's ``validation`` is ``validation_matched``)."""
    if task not in GLUE_FIELDS:
        raise ValueError(f"unknown GLUE task {task!r}; choose one of {sorted(GLUE_FIELDS)}")
    if task == "mnli" and split == "validation":
        split = "validation_matched"
    ds = _load_dataset("nyu-mll/glue", task, split=split)
    text, pair = GLUE_FIELDS[task]
    records = []
    for row in ds:
        if row["label"] == -1:
            raise ValueError(f"GLUE {task} split {split!r} has hidden labels; evaluate on a validation split")
        rec = {"text": row[text], "label": row["label"]}
        if pair:
            rec["text_pair"] = row[pair]
        records.append(rec)
    return records


def load_squad(version: int = 1, split: str = "validation") -> list[dict[str, Any]]:
    """SQuAD v1.1 or v2.0 records ``{"id", "question", "context", "answers"}`` through ``datasets``."""
    if version not in (1, 2):
        raise ValueError(f"SQuAD version must be 1 or 2, got {version!r}")
    ds = _load_dataset("rajpurkar/squad" if version == 1 else "rajpurkar/squad_v2", split=split)
    return [
        {"id": r["id"], "question": r["question"], "context": r["context"], "answers": list(r["answers"]["text"])}
        for r in ds
    ]


def _get(rec: Any, key: str, path: Path, index: int) -> Any:
    if not isinstance(rec, Mapping):
        raise ValueError(f"{path}: record {index} is not an object")
    if key not in rec or rec[key] is None:
        raise ValueError(f"{path}: record {index} has no field {key!r} (fields: {sorted(rec)})")
    return rec[key]


def _parse_label(value: Any) -> Any:
    """CSV labels arrive as strings: integers and floats are turned back into numbers."""
    if isinstance(value, str):
        v = value.strip()
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return v
    return value


def read_classification_file(
    path: str | Path,
    text_field: str = "text",
    text_pair_field: str | None = None,
    label_field: str = "label",
) -> list[dict[str, Any]]:
    """Classification records from a local CSV / TSV / JSONL / JSON file.

    Each record gets ``text`` (and ``text_pair`` when ``text_pair_field`` is set) and ``label``
    (numbers parsed; names such as ``positive`` are kept and mapped through the model's
    ``label2id`` at evaluation). Missing fields raise a ``ValueError`` naming file, record and field.
    """
    path, rows = read_rows(path)
    records = []
    for i, row in enumerate(rows, 1):
        rec = {"text": str(_get(row, text_field, path, i))}
        if text_pair_field:
            rec["text_pair"] = str(_get(row, text_pair_field, path, i))
        rec["label"] = _parse_label(_get(row, label_field, path, i))
        records.append(rec)
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def _answer_texts(value: Any, path: Path, index: int) -> list[str]:
    """Answers as a list of strings from the common layouts (list of str / of dicts, HF dict, str)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, Mapping) and "text" in value:
        return _answer_texts(value["text"], path, index)
    if isinstance(value, list):
        out = []
        for a in value:
            if isinstance(a, Mapping) and "text" in a:
                out.append(str(a["text"]))
            elif isinstance(a, str):
                out.append(a)
            else:
                raise ValueError(f"{path}: record {index}: an answer must be a string or {{'text': ...}}, got {a!r}")
        return out
    raise ValueError(f"{path}: record {index}: 'answers' must be a list, a string or {{'text': [...]}}")


def read_qa_file(
    path: str | Path,
    question_field: str = "question",
    context_field: str = "context",
    answers_field: str = "answers",
    id_field: str = "id",
) -> list[dict[str, Any]]:
    """QA records from JSONL / JSON records, or from an official SQuAD ``{"data": [articles]}`` file.

    Records without ``id_field`` are numbered; an empty answer list (or SQuAD's ``is_impossible``)
    marks an unanswerable question.
    """
    path, rows = read_rows(path)
    if rows and isinstance(rows[0], Mapping) and "paragraphs" in rows[0]:  # official SQuAD layout
        flat = []
        for article in rows:
            for para in article["paragraphs"]:
                for qa in para["qas"]:
                    answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                    row = {id_field: qa["id"], question_field: qa["question"], context_field: para["context"]}
                    flat.append({**row, answers_field: answers})
        rows = flat
    records = []
    for i, row in enumerate(rows, 1):
        records.append(
            {
                "id": str(row[id_field]) if isinstance(row, Mapping) and id_field in row else str(i),
                "question": str(_get(row, question_field, path, i)),
                "context": str(_get(row, context_field, path, i)),
                "answers": _answer_texts(_get(row, answers_field, path, i), path, i),
            }
        )
    if not records:
        raise ValueError(f"{path} holds no records")
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        dup = next(x for x, c in Counter(ids).items() if c > 1)
        raise ValueError(f"{path}: question id {dup!r} occurs more than once")
    return records


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


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
            raise ValueError(f"record {index}: label {label} is outside the model's {n_labels} classes")
        return label
    if isinstance(label, str):
        lookup = {str(k).lower(): v for k, v in label2id.items()}
        if label.lower() in lookup:
            return int(lookup[label.lower()])
    raise ValueError(f"record {index}: label {label!r} is not a class index or a name in label2id {dict(label2id)}")


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
            raise ValueError(f"record {i} needs 'text' and 'label' (fields: {sorted(rec)})")
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
            raise ValueError(f"QA record {i} has no field {missing[0]!r} (fields: {sorted(rec)})")
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
    context_seq = 1 if pad_right else 0
    model.eval()
    device = _device_of(model)
    start_all: list[list[float]] = []
    end_all: list[list[float]] = []
    for lo in range(0, n_features, batch_size):
        out = model(**_model_inputs(enc, slice(lo, lo + batch_size), device))
        start_all.extend(out.start_logits.float().tolist())
        end_all.extend(out.end_logits.float().tolist())
    best: dict[int, tuple[float, int, int, int]] = {}  # example → (score, feature, start, end)
    null: dict[int, float] = {}
    for f in range(n_features):
        ex = enc["overflow_to_sample_mapping"][f]
        seq_ids = enc.sequence_ids(f)
        offsets = [o if seq_ids[k] == context_seq else None for k, o in enumerate(enc["offset_mapping"][f])]
        ids = enc["input_ids"][f]
        cls = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else 0
        null_score = start_all[f][cls] + end_all[f][cls]
        null[ex] = min(null.get(ex, math.inf), null_score)
        span = _best_span(start_all[f], end_all[f], offsets, n_best, max_answer_length)
        if span is not None and (ex not in best or span[0] > best[ex][0]):
            best[ex] = (span[0], f, span[1], span[2])
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
