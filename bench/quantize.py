"""Prune and quantize: held-out perplexity in llama.cpp against file size, for SmolLM2-135M pruned by the
default recipe (0, 20, 35, 50%, and 50% as 8 blocks + width) × llama.cpp's types (f16, q8_0, q5_k_m,
q4_k_m, q3_k_m, iq3_xxs), each K/i type with and without the importance matrix our calibration text
gives (``core.serving.quantize``; iq3_xxs only with one: llama.cpp refuses it without).

The pruned checkpoints are the serving page's (``bench/serving.py``, cached under ``$LIAR_CACHE/serving``);
perplexity is llama.cpp's own (the worker's ``nll`` op) on the serving page's 20 windows of 512 tokens of
held-out Wikipedia text. Writes docs/results/quantize.json and quantize.md (with figures/quantize.svg).

    python bench/quantize.py [--threads 2] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quantize_page import TYPES, WEIGHTED, write  # noqa: E402
from bench.serving import WORK, checkpoint, eval_windows, label, llama_nll, machine  # noqa: E402

OUT = ROOT / "docs" / "results" / "quantize.md"
JSON = OUT.with_suffix(".json")
MODELS = ("dense", "0.2", "0.35", "0.5", "0.5-depth8")
# --qwen: Qwen2.5-Coder-0.5B dense and at 50%, with and without round_to.k_quant (its own JSON, a section
# of the same page); fewer files per model, each several times SmolLM2's work
QWEN_JSON = JSON.with_name("quantize_qwen25.json")
QWEN_MODELS = {"dense": "dense", "0.5": "50% removed", "0.5-k256": "50% removed, widths × 256"}
QWEN_CELLS = [("f16", False), ("q4_k_m", False), ("q4_k_m", True), ("q3_k_m", True)]


def cells(model: str) -> list[tuple[str, bool]]:
    """(type, with the importance matrix) of one model's files."""
    plain = [(t, False) for t in TYPES if t != "iq3_xxs"]
    return plain + [(t, True) for t in WEIGHTED]


def qwen_checkpoint(model: str, threads: int) -> Path:
    """Qwen2.5-Coder-0.5B dense, or pruned by the default recipe (``-k256``: row lengths kept K-quant whole)."""
    from bench.assets import qwen25_coder_dir
    from bench.serving import default_recipe, pruned_checkpoint

    if model == "dense":
        return qwen25_coder_dir()
    recipe = default_recipe(float(model.split("-")[0])) | {"model": str(qwen25_coder_dir())}
    if model.endswith("-k256"):
        recipe["round_to"] = {**recipe.get("round_to", {}), "k_quant": True}
    return pruned_checkpoint(WORK / f"qwen25-default-{model}", recipe, threads, f"Qwen2.5-Coder-0.5B {model}")


def gguf(src: Path, model: str, quant: str, weighted: bool, matrix: Path | None, threads: int) -> Path:
    from core.serving.gguf_export import export_gguf

    out = WORK / "quantize" / f"{src.name}-{model}-{quant}{'-imatrix' if weighted else ''}.gguf"
    newest = max((src / "config.json").stat().st_mtime, matrix.stat().st_mtime if weighted and matrix else 0)
    if out.is_file() and out.stat().st_mtime >= newest:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    export_gguf(src, out, quant=quant, threads=threads, imatrix=matrix if weighted else None)
    return out


def measure_model(model: str, threads: int, qwen: bool = False) -> dict:
    """One model's row: its importance matrix, then every file's size, fallbacks and perplexity."""
    import torch

    from bench.assets import wikipedia_split
    from core.models.loading import load_pruned
    from core.serving.quantize import fallbacks, imatrix_for, tensor_types

    src = qwen_checkpoint(model, threads) if qwen else checkpoint(model, threads)
    t = time.perf_counter()
    text = wikipedia_split()[0] if model == "dense" else None  # a pruned checkpoint's recipe names its text
    matrix, made_from = imatrix_for(src, text)
    row = {"label": QWEN_MODELS[model] if qwen else label(model), "imatrix": made_from}
    row["imatrix_seconds"] = round(time.perf_counter() - t, 1)
    net, tok = load_pruned(src, dtype=torch.float32)
    windows = eval_windows(tok, net.config)
    del net
    row["files"] = {}
    for quant, weighted in QWEN_CELLS if qwen else cells(model):
        path = gguf(src, model, quant, weighted, matrix, threads)
        t = time.perf_counter()
        key = f"{quant}{'+imatrix' if weighted else ''}"
        row["files"][key] = {
            "mib": round(path.stat().st_size / 2**20, 2),
            "perplexity": llama_nll(path, windows, threads)["perplexity"],
            "fallbacks": fallbacks(tensor_types(path), quant),
            "seconds": round(time.perf_counter() - t, 1),
        }
        print(f"{model} {key}: {row['files'][key]['perplexity']:.2f} ({row['files'][key]['mib']} MiB)", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp and torch threads")
    p.add_argument("--report-only", action="store_true", help="rewrite the page from the JSON, run nothing")
    p.add_argument("--qwen", action="store_true", help="Qwen2.5-Coder-0.5B's section (quantize_qwen25.json)")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = QWEN_JSON if args.qwen else JSON
    data = json.loads(path.read_text()) if path.exists() else {"models": {}}
    if not args.report_only:
        import datetime as dt

        t0 = time.perf_counter()
        data["machine"] = machine(args.threads)
        data["date"] = dt.date.today().isoformat()
        for model in QWEN_MODELS if args.qwen else MODELS:
            data["models"][model] = measure_model(model, args.threads, args.qwen)
            path.write_text(json.dumps(data, indent=2) + "\n")
        data["seconds"] = round(time.perf_counter() - t0)
        path.write_text(json.dumps(data, indent=2) + "\n")
    qwen = json.loads(QWEN_JSON.read_text()) if QWEN_JSON.exists() else None
    write(json.loads(JSON.read_text()), OUT, qwen)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
