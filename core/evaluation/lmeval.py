"""Zero-/few-shot evaluation of causal language models with the lm-evaluation-harness.

``evaluate_lm_eval`` runs harness tasks on a model object held in memory — including pruned models
whose layers have different widths, which are plain ``nn.Module`` trees the harness cannot rebuild
from a config — or on a checkpoint directory loaded through :func:`core.models.adapter.load_model`.

Two kinds of task are supported:

- **Registry tasks**, e.g. the seven zero-shot tasks of the paper (``core.evaluation.tasks.PAPER_TASKS``). Their data
  come from the Hugging Face Hub; without it, loading fails with an error that says so.
- **Local tasks** that work offline: task YAMLs written by the builders below into a directory
  (``dataset_path: json`` over a JSONL file next to the YAML) and registered with
  ``TaskManager(include_path=task_dir)``:

  ``rt_sentiment``  zero-shot sentiment of a movie-review snippet as a two-way multiple choice
                    (continuations `` negative`` / `` positive``; metric ``acc``).
  ``wiki_cloze``    next-word cloze on encyclopedic text: the context is the passage up to a word,
                    the choices are that word and ``n_distractors`` other words of the corpus, drawn
                    with their corpus frequency (so a model that ignores the context, scoring words
                    by frequency alone, is about at chance, ``1 / (n_distractors + 1)``); metric
                    ``acc`` (highest log-likelihood wins), plus ``acc_norm`` (per byte).

The builders take plain lists of records, so tests use a few made-up rows and benchmarks feed the
real data (``bench/assets.py``). The result keeps the harness's whole results object (made JSON-safe)
next to a flat ``{task: {metric: value}}`` summary.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from core.evaluation.tasks import TASKS_ACC_MEAN, TaskSelection, load_tasks, select_tasks
from core.kernels.cpu_matmul import route_linears
from core.models.adapter import adapter_for
from core.models.loading import ensure_pad_token, load_model, resolve_device

_SENTIMENT_LABELS = {"negative": 0, "rotten": 0, "neg": 0, "positive": 1, "fresh": 1, "pos": 1}
_LOWER_WORD = re.compile(r"[a-z]+")


# --------------------------------------------------------------------------------------------
# Task builders
# --------------------------------------------------------------------------------------------
def _write_task(task_dir: str | Path, name: str, config: dict[str, Any], splits: Mapping[str, list[dict]]) -> Path:
    """Write ``<name>.yaml`` and one JSONL data file per split into ``task_dir``; returns the YAML path.

    Data file names carry a hash of their content: the ``datasets`` cache keys a local JSON dataset
    by its files, so rewriting the same path with new rows could otherwise serve the old rows.
    """
    task_dir = Path(task_dir).expanduser().resolve()
    task_dir.mkdir(parents=True, exist_ok=True)
    for old in task_dir.glob(f"{name}.*.jsonl"):
        old.unlink()
    data_files: dict[str, str] = {}
    for split, rows in splits.items():
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        digest = hashlib.sha256(body.encode("utf-8")).hexdigest()[:12]
        path = task_dir / f"{name}.{split}-{digest}.jsonl"
        path.write_text(body, encoding="utf-8")
        data_files[split] = str(path)
    full = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": data_files},
        "test_split": "test",
        **config,
        "metadata": {"version": 1.0},
    }
    if "train" in splits:
        full["training_split"] = "train"
        full["fewshot_split"] = "train"
    out = task_dir / f"{name}.yaml"
    out.write_text(yaml.safe_dump(full, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return out


def _field(record: Mapping[str, Any], key: str, index: int, what: str) -> Any:
    if not isinstance(record, Mapping):
        raise ValueError(f"{what} record {index} is not a mapping (got {type(record).__name__})")
    if key not in record:
        raise ValueError(f"{what} record {index} has no field {key!r}")
    return record[key]


def _sentiment_label(value: Any, index: int) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value in (0, 1):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in ("0", "1"):
            return int(key)
        if key in _SENTIMENT_LABELS:
            return _SENTIMENT_LABELS[key]
    raise ValueError(f"sentiment record {index}: the label is not 0/1 or one of {sorted(_SENTIMENT_LABELS)}")


def sentiment_rows(records: Iterable[Mapping[str, Any]], text_field: str = "text", label_field: str = "label") -> list:
    """``[{"text", "label"}]`` with labels 0 (negative) / 1 (positive); bad records are named."""
    rows = []
    for i, rec in enumerate(records, 1):
        text = str(_field(rec, text_field, i, "sentiment")).strip()
        if not text:
            raise ValueError(f"sentiment record {i} has an empty {text_field!r}")
        rows.append({"text": text, "label": _sentiment_label(_field(rec, label_field, i, "sentiment"), i)})
    if not rows:
        raise ValueError("no sentiment records given")
    return rows


def write_rt_sentiment_task(
    task_dir: str | Path,
    records: Iterable[Mapping[str, Any]],
    *,
    fewshot_records: Iterable[Mapping[str, Any]] | None = None,
    name: str = "rt_sentiment",
) -> Path:
    """Write the ``rt_sentiment`` task (movie-review sentiment, two-way multiple choice).

    ``records`` hold ``text`` and ``label`` (0/1, ``negative``/``positive`` or ``rotten``/``fresh``).
    The prompt asks whether the review is positive or negative; the two continuations are scored
    by log-likelihood and ``acc`` is the fraction where the gold one scores higher. Few-shot
    examples (``num_fewshot``) are drawn from ``fewshot_records`` when given, so evaluation rows
    are never shown as examples.
    """
    splits = {"test": sentiment_rows(records)}
    if fewshot_records is not None:
        splits["train"] = sentiment_rows(fewshot_records)
    config = {
        "output_type": "multiple_choice",
        "doc_to_text": "Movie review: {{text}}\nIs this review positive or negative?\nAnswer:",
        "doc_to_target": "label",
        "doc_to_choice": ["negative", "positive"],
        "target_delimiter": " ",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    return _write_task(task_dir, name, config, splits)


def cloze_items(
    passages: Sequence[str],
    *,
    items_per_passage: int = 1,
    min_context_words: int = 12,
    max_context_words: int = 64,
    n_distractors: int = 4,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Seeded next-word cloze items ``{"context", "choices", "label"}`` from passages of text.

    A target is a lower-case alphabetic word with at least ``min_context_words`` words before it
    in its passage; the context is the text before it (at most ``max_context_words`` words,
    trailing space removed). Distractors are distinct lower-case words of the whole corpus, drawn
    with probability proportional to their count (never the target itself), and the gold choice
    sits at a random position. Restricting to lower-case words keeps capitalisation from giving the
    answer away.
    """
    if n_distractors < 1:
        raise ValueError("n_distractors must be at least 1")
    if min_context_words < 1 or max_context_words < min_context_words:
        raise ValueError("need 1 <= min_context_words <= max_context_words")
    rng = random.Random(seed)
    spans = [list(re.finditer(r"\S+", p)) for p in passages]

    def target_word(match: re.Match) -> str | None:
        word = match.group().rstrip(".,;:!?)]}\"'")
        return word if _LOWER_WORD.fullmatch(word) else None

    pool = [w for ps in spans for m in ps if (w := target_word(m))]
    if len(set(pool)) < n_distractors + 1:
        raise ValueError(
            f"the passages hold {len(set(pool))} distinct lower-case words; need more than {n_distractors} "
            "to draw distractors"
        )
    items = []
    for text, ps in zip(passages, spans):
        candidates = [j for j in range(min_context_words, len(ps)) if target_word(ps[j])]
        for j in sorted(rng.sample(candidates, min(items_per_passage, len(candidates)))):
            gold = target_word(ps[j])
            start = ps[max(0, j - max_context_words)].start()
            context = text[start : ps[j].start()].rstrip()
            distractors: list[str] = []
            while len(distractors) < n_distractors:
                w = rng.choice(pool)
                if w != gold and w not in distractors:
                    distractors.append(w)
            label = rng.randrange(n_distractors + 1)
            choices = distractors[:label] + [gold] + distractors[label:]
            items.append({"context": context, "choices": choices, "label": label})
    if not items:
        raise ValueError(f"no passage has a lower-case word after at least {min_context_words} words")
    return items


def write_cloze_task(task_dir: str | Path, items: Iterable[Mapping[str, Any]], *, name: str = "wiki_cloze") -> Path:
    """Write a cloze task from ready items ``{"context", "choices", "label"}`` (see :func:`cloze_items`)."""
    rows = []
    for i, item in enumerate(items, 1):
        context = str(_field(item, "context", i, "cloze"))
        choices = _field(item, "choices", i, "cloze")
        label = _field(item, "label", i, "cloze")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"cloze record {i}: 'choices' must be a list of at least two non-empty strings")
        if not isinstance(label, int) or not 0 <= label < len(choices):
            raise ValueError(f"cloze record {i}: 'label' must index 'choices' (0..{len(choices) - 1}), got {label!r}")
        rows.append({"context": context, "choices": choices, "label": label})
    if not rows:
        raise ValueError("no cloze records given")
    config = {
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_target": "label",
        "doc_to_choice": "{{choices}}",
        "target_delimiter": " ",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
    }
    return _write_task(task_dir, name, config, {"test": rows})


def write_wiki_cloze_task(task_dir: str | Path, passages: Sequence[str], **options: Any) -> Path:
    """Write the ``wiki_cloze`` task from passages; ``options`` go to :func:`cloze_items`."""
    return write_cloze_task(task_dir, cloze_items(passages, **options), name="wiki_cloze")


# --------------------------------------------------------------------------------------------
# Task lookup and evaluation
# --------------------------------------------------------------------------------------------
def _jsonable(obj: Any) -> Any:
    """The same structure with everything JSON cannot hold (dtypes, numpy scalars) as strings."""

    def default(o: Any) -> Any:
        if hasattr(o, "item") and callable(o.item):
            try:
                return o.item()
            except (TypeError, ValueError):
                pass
        return str(o)

    return json.loads(json.dumps(obj, default=default))


def summarize(raw: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from a harness results object (filter suffixes such as ``,none`` dropped)."""
    summary: dict[str, dict[str, float]] = {}
    for task, metrics in raw.get("results", {}).items():
        row: dict[str, float] = {}
        for key, value in metrics.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            row[metric if filt == "none" else f"{metric}[{filt}]"] = float(value)
        summary[task] = row
    return summary


def task_metrics(summary: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """A run's task summary as flat metrics: ``<task>.<metric>`` (``piqa.acc``, ``piqa.acc_norm``, their
    ``_stderr``), and :data:`TASKS_ACC_MEAN`, the mean accuracy over the tasks that report one (the
    "average" column of the paper's zero-shot tables)."""
    out = {f"{task}.{metric}": float(value) for task, row in summary.items() for metric, value in row.items()}
    accs = [row["acc"] for row in summary.values() if "acc" in row]
    if accs:
        out[TASKS_ACC_MEAN] = sum(accs) / len(accs)
    return out


def evaluate_lm_eval(
    model: Any,
    tokenizer: Any,
    tasks: str | Sequence[str] | TaskSelection,
    *,
    batch_size: int = 8,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    device: str | None = None,
    task_dir: str | Path | None = None,
    dtype: str = "auto",
    bootstrap_iters: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Run lm-eval tasks on a causal LM; returns ``{"summary", "raw", "tasks", "seconds", "parameters"}``.

    ``model`` is a model object (with its ``tokenizer``) or a hub id / checkpoint directory (then
    ``tokenizer`` may be None). ``tasks`` are names (a list, or one comma-separated string) of
    local tasks in ``task_dir`` or of lm-eval registry tasks, or a :func:`select_tasks` result
    (callers that check names before loading a model pass it on to avoid a second lookup).
    ``limit`` caps the examples per task (an int, or a fraction below 1). ``summary`` maps each task
    to its metrics (``acc``, ``acc_stderr``, …); ``raw`` is the harness's whole results object,
    JSON-safe. ``seed`` seeds the harness (few-shot sampling).
    """
    selection = tasks if isinstance(tasks, TaskSelection) else select_tasks(tasks, task_dir)
    if isinstance(model, (str, Path)):
        model, tokenizer, adapter = load_model(str(model), dtype, device or "auto")
    else:
        adapter = adapter_for(model)
        if tokenizer is None:
            raise ValueError("a tokenizer is needed when a model object is passed")
        if device is not None:
            model = model.to(resolve_device(device))
    if adapter.kind != "decoder":
        raise ValueError("lm-eval tasks need a causal language model; evaluate encoders with core.evaluation.encoder")
    ensure_pad_token(tokenizer)
    specs = load_tasks(selection)

    from lm_eval.models.huggingface import HFLM

    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size)
    out = run_harness(lm, selection, specs, num_fewshot, limit, bootstrap_iters, seed)
    return {**out, "parameters": sum(p.numel() for p in model.parameters())}


def run_harness(lm, selection: TaskSelection, specs: list, num_fewshot, limit, bootstrap_iters: int, seed: int) -> dict:
    """``simple_evaluate`` on a harness model ``lm``: ``{"summary", "raw", "tasks", "seconds"}``."""
    from lm_eval import simple_evaluate

    t0 = time.perf_counter()
    with route_linears(lm.model, getattr(lm, "device", "cpu")):
        raw = simple_evaluate(
            model=lm,
            tasks=specs,
            task_manager=selection.manager,
            num_fewshot=num_fewshot,
            limit=limit,
            bootstrap_iters=bootstrap_iters,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    seconds = time.perf_counter() - t0
    if raw is None:  # only non-zero ranks of a distributed run get None
        raise RuntimeError("lm-eval returned no results (not the main process of a distributed run?)")
    raw = _jsonable(raw)
    return {"summary": summarize(raw), "raw": raw, "tasks": selection.names, "seconds": round(seconds, 3)}
