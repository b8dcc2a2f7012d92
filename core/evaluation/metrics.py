"""Task metrics (plain Python, no torch): all fractions in [0, 1], or correlations in [-1, 1].

- classification: ``accuracy``;
- regression (a model with one output, e.g. STS-B): ``spearman`` — the Pearson correlation of the
  ranks, ties given their average rank — and ``pearson``;
- extractive QA: SQuAD ``exact_match`` and ``f1`` with the official answer normalisation (lower
  case, punctuation removed, articles *a/an/the* removed, whitespace collapsed), each the maximum
  over the gold answers. SQuAD v2 adds unanswerable questions: their only gold answer is the empty
  string, so an empty prediction scores 1 on both metrics and anything else 0.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


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
