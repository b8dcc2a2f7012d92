"""Encoder task data: GLUE and SQuAD through ``datasets`` when the Hugging Face Hub is reachable
(:func:`load_glue`, :func:`load_squad`), or local CSV / TSV / JSONL / JSON files
(:func:`read_classification_file`, :func:`read_qa_file`). Records are plain dicts: classification
``{"text", "text_pair" (optional), "label"}``, QA ``{"id", "question", "context", "answers": [str, ...]}``
(an empty list marks an unanswerable question).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.data.texts import read_rows

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
        raise ValueError(f"{path}: record {index} has no field {key!r}")
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
