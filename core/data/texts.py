"""Text sources: named sets through ``datasets`` (needs the Hugging Face Hub) and local files.

One reader for every place that takes text records: calibration sets, evaluation text, labels and
encoder task files. Local files are ``.txt`` (documents separated by blank lines), ``.jsonl`` (one
record a line) or ``.json`` (a list of records, or ``{"data": [...]}``); errors name the file and
the record.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from core.spec.recipe import NAMED_DATASETS

# Named sets load through `datasets` (needs the Hugging Face Hub). Each entry: args, kwargs, text fields.
_NAMED = {
    "wikitext2": (("wikitext", "wikitext-2-raw-v1"), {"split": "train"}, ("text",)),
    "c4": (
        ("allenai/c4",),
        {"data_files": {"train": "en/c4-train.00000-of-01024.json.gz"}, "split": "train"},
        ("text",),
    ),
    "alpaca": (("tatsu-lab/alpaca",), {"split": "train"}, ("text",)),
}


def load_named(name: str) -> list[str]:
    """Documents of a named calibration set, through ``datasets`` (requires network access)."""
    if name not in _NAMED:
        raise ValueError(f"unknown named dataset {name!r}; choose one of {NAMED_DATASETS}")
    args, kwargs, fields = _NAMED[name]
    try:
        import datasets

        ds = datasets.load_dataset(*args, **kwargs)
    except Exception as exc:  # network, auth, missing package: say what to do instead
        raise RuntimeError(
            f"could not load the named calibration set {name!r} through `datasets` ({type(exc).__name__}: "
            f"{exc}). Without access to the Hugging Face Hub, pass a local .txt or .jsonl file instead."
        ) from exc
    if name == "wikitext2":  # WikiText is one line per record; rejoin as one document
        return ["\n".join(r["text"] for r in ds)]
    return [" ".join(str(r[f]) for f in fields) for r in ds]


def parse_jsonl(path: Path, text: str) -> list:
    """One JSON value per non-blank line; errors name the file and line."""
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
    return rows


def read_rows(path: str | Path) -> tuple[Path, list[Any]]:
    """Raw rows of a CSV (dicts of strings), JSONL or JSON (a list, or ``{"data": [...]}``) file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    if suffix in (".csv", ".tsv"):
        return path, list(csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ","))
    if suffix == ".jsonl":
        return path, parse_jsonl(path, text)
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if isinstance(data, dict) and "data" in data:
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records (or {{'data': [...]}})")
        return path, data
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .csv, .tsv, .jsonl or .json")


def read_records(path: str | Path, text_field: str | list[str]) -> list[str | tuple[str, str]]:
    """Texts from a .txt file (blank-line separated documents) or a .jsonl / .json file of records."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".txt":
        docs = [d.strip() for d in path.read_text(encoding="utf-8").split("\n\n")]
        return [d for d in docs if d]
    _, records = read_rows(path)
    fields = [text_field] if isinstance(text_field, str) else list(text_field)
    out: list[str | tuple[str, str]] = []
    for i, rec in enumerate(records, 1):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: record {i} is not an object")
        missing = [f for f in fields if f not in rec]
        if missing:
            raise ValueError(f"{path}: record {i} has no field {missing[0]!r}")
        vals = [str(rec[f]) for f in fields]
        out.append(vals[0] if len(vals) == 1 else tuple(vals[:2]))
    if not out:
        raise ValueError(f"{path} holds no records")
    return out


_EVAL_SPLITS = {"wikitext2": "test"}


def eval_texts(source: str | Path | list[str], text_field: str = "text") -> list[str]:
    """Documents from a named set (its evaluation split where it has one), a file, or strings."""
    if isinstance(source, list):
        texts = [t for t in source if t.strip()]
    elif str(source) in NAMED_DATASETS:
        if str(source) == "wikitext2":
            import datasets

            try:
                ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=_EVAL_SPLITS["wikitext2"])
            except Exception as exc:
                raise RuntimeError(
                    f"could not load wikitext2 through `datasets` ({exc}); pass a local text file instead"
                ) from exc
            texts = ["\n".join(ds["text"])]
        else:
            texts = load_named(str(source))
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"evaluation text {str(source)!r} is neither a named set nor a file")
        texts = [t if isinstance(t, str) else "\n".join(t) for t in read_records(path, text_field)]
    if not texts:
        raise ValueError("the evaluation text is empty")
    return texts
