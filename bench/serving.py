"""The default recipe's pruned SmolLM2-135M served by stock llama.cpp: GGUF export, perplexity, size, speed.

SmolLM2-135M dense and pruned by the default recipe at 20% and 50% (``criterion: auto`` → obs,
``allocation: global``; calibration as ``bench/obs_allocation.py --auto``: 128 × 128 tokens of the
Wikipedia calibration articles), each saved as a checkpoint under ``$LIAR_CACHE/serving`` (kept: a
re-run reuses it) and exported with ``core.serving.gguf_export.export_gguf`` to GGUF f16, f32 and
q4_k_m (the f16 file quantized by llama.cpp's own quantizer).

- Quality: perplexity on the 20 windows of 512 tokens of the held-out Wikipedia articles that the
  later pages use, computed by ``core.perplexity`` on the saved checkpoint (float32, torch) and by
  llama.cpp itself (the worker's ``nll`` op on the same token ids, from llama.cpp's logits).
- Size: each GGUF's file size, and the bytes of weights a decoded token reads (every tensor of the
  file: the tied embedding is read whole as the output head).
- Speed: llama.cpp batch-1 greedy decode (a 128-token prompt, then 64 tokens) and prefill (a 512-token
  prompt) tokens/s at ``--threads``. The machine may be shared, so the models run interleaved within
  each round (dense, 20%, 50%, for f16 then q4_k_m), each call a fresh llama.cpp process (one warm-up
  pass, then the median of ``--inner`` passes); the page gives the median over ``--rounds`` rounds and
  the spread (min–max).

Each model's quality row is kept beside its files (``$LIAR_CACHE/serving/rows``) until they change,
so an interrupted run resumes with the next model.
- Gemma 3 270M: dense and pruned 20% by the default recipe made uniform and bias-free (what llama.cpp's
  ``gemma3`` architecture can state), in GGUF f16 and q4_k_m: perplexity ours and llama.cpp's.

    python bench/serving.py [--threads 2] [--rounds 7]
    python bench/serving.py --only-speed      # re-measure the speeds, keep the quality part
    python bench/serving.py --skip-speed      # quality and sizes only
    python bench/serving.py --only-gemma      # the Gemma 3 section only
    python bench/serving.py --report-only     # rewrite the page from docs/results/serving.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import CACHE, smollm2_dir, wikipedia_split  # noqa: E402
from bench.common import machine as torch_machine  # noqa: E402
from bench.common import today  # noqa: E402
from bench.serving_report import DIAGNOSTIC, JSON, MODELS, OUT, QUANTS, label, model_fields, ratio_of, summary, write  # noqa: E402

WORK = CACHE / "serving"
SEQ_LEN, WINDOWS = 512, 20  # the later pages' protocol (bench/unseen.both_texts)
DECODE_PROMPT, DECODE_TOKENS, PREFILL_PROMPT = 128, 64, 512


# ---------------------------------------------------------------- checkpoints and files


def default_recipe(ratio: float) -> dict:
    """The default recipe as ``bench/obs_allocation.py --auto`` runs it (criterion auto resolves to obs,
    allocation global), on the same calibration."""
    from bench.unseen import recipe

    return recipe("auto", ratio) | {"allocation": "auto", "criterion": {"name": "auto"}}


def model_recipe(model: str) -> dict:
    """The recipe of a pruned model key: the default recipe at its ratio, with its variant's fields."""
    return default_recipe(ratio_of(model)) | model_fields(model)


def checkpoint(model: str, threads: int) -> Path:
    """The model's checkpoint folder: the dense asset, or the pruned one in the cache (pruned once)."""
    if model == "dense":
        return smollm2_dir()
    suffix = model.partition("-")[2]
    out = WORK / (f"smollm2-default-{round(ratio_of(model) * 100)}" + (f"-{suffix}" if suffix else ""))
    return pruned_checkpoint(out, model_recipe(model), threads, label(model))


def pruned_checkpoint(out: Path, recipe: dict, threads: int, what: str) -> Path:
    """``out`` holding the checkpoint ``recipe`` prunes and its ``prune.json`` (pruned once: a folder that
    has both is kept)."""
    if (out / "config.json").is_file() and (out / "prune.json").is_file():
        return out
    import shutil

    import torch

    from core import prune

    torch.set_num_threads(threads)
    print(f"pruning {what} …", flush=True)
    result = prune(recipe)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    result.save(tmp)
    info = {
        "achieved_ratio": result.achieved_ratio,
        "prune_seconds": round(result.seconds, 1),
        "params_after": result.params_after,
        "layers": [[len(lp.heads), len(lp.kv_heads), len(lp.neurons)] for lp in result.plan.layers],
        "resolved": {"criterion": result.recipe.criterion.model_dump(), "allocation": result.recipe.allocation},
        "removed_blocks": result.metrics.get("depth_blocks_removed", []),
    }
    (tmp / "prune.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    del result
    return out


def gguf_file(model: str, quant: str, threads: int) -> Path:
    """The model's GGUF of ``quant`` under the cache, exported when missing or older than its checkpoint."""
    from core.serving.gguf_export import export_gguf

    src = checkpoint(model, threads)
    out = WORK / "gguf" / f"smollm2-{model}-{quant}.gguf"
    if out.is_file() and out.stat().st_mtime >= (src / "config.json").stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    export_gguf(src, out, quant=quant, threads=threads)
    print(f"exported {out.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def tensor_bytes(path: Path) -> dict:
    """The file's size, its tensors' bytes and architecture (the project's ``gguf`` reader)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"]
    tensors = {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors}
    types: dict[str, int] = {}  # the blocks' matrices, bytes by type (a quantizer falls back on odd widths)
    for name, (kind, n) in tensors.items():
        if name.startswith("blk.") and name.endswith(".weight") and "norm" not in name:
            types[kind] = types.get(kind, 0) + n
    return {
        "mib": path.stat().st_size / 2**20,
        "arch": arch.contents(),
        "tensor_bytes": sum(b for _, b in tensors.values()),
        "embedding": tensors["token_embd.weight"],
        "has_output": "output.weight" in tensors,
        "block_matrix_types": types,
    }


def eval_windows(tokenizer, config) -> list[list[int]]:
    """The token ids of the evaluation windows, exactly as ``core.perplexity`` draws them."""
    from core.evaluation.perplexity import eval_windows as windows

    return windows(config, tokenizer, str(wikipedia_split()[1]), SEQ_LEN, WINDOWS)


def llama_cpp_version() -> str:
    from core.serving.engines import llama_cpp_python

    py = llama_cpp_python()
    cmd = [py, "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def priority() -> str:
    """This process's scheduling (its llama.cpp processes inherit it): ``chrt -f 10 python bench/...``
    gives the timings the CPU ahead of other work on a shared machine."""
    policy = os.sched_getscheduler(0)
    if policy in (os.SCHED_FIFO, os.SCHED_RR):
        name = "SCHED_FIFO" if policy == os.SCHED_FIFO else "SCHED_RR"
        return f"real-time ({name} {os.sched_getparam(0).sched_priority})"
    return "normal"


def machine(threads: int) -> dict:
    return torch_machine(threads) | {"llama_cpp_python": llama_cpp_version(), "threads": threads}


# ---------------------------------------------------------------- the measurements


def evaluated(key: str, src: Path, batch_size: int) -> tuple[dict, dict, list[list[int]]]:
    """Model ``key``'s row (or its ``prune.json``), our perplexity of ``src`` and the windows' token ids."""
    import torch

    from core import perplexity
    from core.models.loading import load_model, load_pruned

    if key == "dense":
        net, tok, _ = load_model(str(src), "float32", "cpu")
        row = {"achieved_ratio": 0.0}
    else:
        net, tok = load_pruned(src, dtype=torch.float32)
        row = json.loads((src / "prune.json").read_text())
    text = str(wikipedia_split()[1])
    ours = perplexity(net, tok, text, seq_len=SEQ_LEN, batch_size=batch_size, max_windows=WINDOWS)
    return row, ours, eval_windows(tok, net.config)


def llama_nll(path: Path, windows: list[list[int]], threads: int, tokens: int | None = None) -> dict:
    """llama.cpp's ``nll`` of ``windows`` under ``path`` and its perplexity (``tokens``: ours, checked)."""
    from core.serving.engines import call_llama_cpp

    got = call_llama_cpp({"op": "nll", "model": str(path), "windows": windows, "threads": threads})
    assert tokens is None or got["tokens"] == tokens, (got["tokens"], tokens)
    return got | {"perplexity": math.exp(got["nll"] / got["tokens"])}


def quality(args) -> dict:
    """Perplexity (ours and llama.cpp's), files and the pruned layouts of every model; Gemma 3's section."""
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    models, resumed = {}, []
    for model in MODELS:
        src = checkpoint(model, args.threads)
        files = {q: gguf_file(model, q, args.threads) for q in (*QUANTS, *DIAGNOSTIC)}
        kept = WORK / "rows" / f"{model}.json"  # a model measured since its files were written: resume
        if kept.is_file() and kept.stat().st_mtime > max(f.stat().st_mtime for f in files.values()):
            models[model] = row = json.loads(kept.read_text()) | {"checkpoint": src.name}  # under $LIAR_CACHE
            for quant, path in files.items():  # what the files' headers say, read afresh
                row["gguf"][quant] |= tensor_bytes(path)
            resumed.append(model)
            continue
        row, ours, windows = evaluated(model, src, batch_size=4)
        row |= {"checkpoint": src.name, "ours": ours["perplexity"], "ours_nll": ours["nll"], "tokens": ours["tokens"]}
        row["gguf"] = {}
        for quant, path in files.items():
            t = time.perf_counter()
            got = llama_nll(path, windows, args.threads, ours["tokens"])
            row["gguf"][quant] = tensor_bytes(path) | {
                "file": path.name,
                "nll": got["nll"],
                "perplexity": got["perplexity"],
                "nll_seconds": round(time.perf_counter() - t, 1),
            }
            theirs = row["gguf"][quant]["perplexity"]
            print(f"{label(model)} {quant}: ours {ours['perplexity']:.3f}, llama.cpp {theirs:.3f}", flush=True)
        models[model] = row
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(row, indent=2))
    return {
        "date": today(),
        "machine": machine(args.threads),
        "protocol": {"seq_len": SEQ_LEN, "windows": WINDOWS, "text": "Wikipedia evaluation articles"},
        "models": models,
        "gemma3": gemma(args),
        "seconds": round(time.perf_counter() - t0, 1),
        "resumed": resumed,  # models whose rows an earlier run measured (their time is not in seconds)
    }


# Gemma 3 270M: llama.cpp's gemma3 architecture states one width per layer and no added biases, so the
# prune that exports is uniform with a bias-free reconstruction (mask_tuning rescales the kept units)
GEMMA = {
    "dense": {},
    "0.2": {
        "allocation": "uniform",
        "round_to": {"kv_groups": "whole", "neurons": 1},
        "reconstruction": {"method": "mask_tuning"},
    },
}


def gemma_checkpoint(key: str, threads: int) -> Path:
    """Gemma 3 270M dense, or pruned by the recipe of ``GEMMA[key]`` at its ratio (pruned once, cached)."""
    from bench.assets import gemma3_270m_dir

    if key == "dense":
        return gemma3_270m_dir()
    out = WORK / f"gemma3-{round(ratio_of(key) * 100)}-uniform"
    recipe = default_recipe(ratio_of(key)) | {"model": str(gemma3_270m_dir())} | GEMMA[key]
    return pruned_checkpoint(out, recipe, threads, f"Gemma 3 270M, {label(key)}")


def gemma(args) -> dict:
    """Gemma 3 270M dense and pruned (``GEMMA``), exported to GGUF f16 and q4_k_m: perplexity ours and
    llama.cpp's on the same windows, and the files."""
    import torch

    from core.serving.gguf_export import export_gguf

    torch.set_num_threads(args.threads)
    rows = {}
    for key, fields in GEMMA.items():
        src = gemma_checkpoint(key, args.threads)
        row, ours, windows = evaluated(key, src, batch_size=2)
        if key != "dense":
            row["recipe"] = fields
        row |= {"ours": ours["perplexity"], "tokens": ours["tokens"], "gguf": {}}
        for quant in QUANTS:
            path = WORK / "gguf" / f"gemma3-{key}-{quant}.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            export_gguf(src, path, quant=quant, threads=args.threads)
            got = llama_nll(path, windows, args.threads, ours["tokens"])
            row["gguf"][quant] = tensor_bytes(path) | {"perplexity": got["perplexity"]}
            print(f"Gemma 3 {label(key)} {quant}: ours {ours['perplexity']:.3f}, llama.cpp "
                  f"{row['gguf'][quant]['perplexity']:.3f}", flush=True)  # fmt: skip
        rows[key] = row
    return {"date": today(), "machine": machine(args.threads), "models": rows}


def speed(args) -> dict:
    """Decode and prefill tokens/s of every model and quant, interleaved within each round."""
    from transformers import AutoTokenizer

    from core.serving.engines import call_llama_cpp

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    from transformers import AutoConfig

    prompt = eval_windows(tok, AutoConfig.from_pretrained(smollm2_dir()))[0]
    files = {(m, q): gguf_file(m, q, args.threads) for q in QUANTS for m in MODELS}
    rounds = []
    for i in range(args.rounds):
        cells = {}
        for q in QUANTS:
            for m in MODELS:
                common = {"op": "speed", "model": str(files[m, q]), "threads": args.threads}
                common |= {"rounds": args.inner, "warmup": 1}
                d = call_llama_cpp(common | {"prompt": prompt[:DECODE_PROMPT], "decode": DECODE_TOKENS})
                p = call_llama_cpp(common | {"prompt": prompt[:PREFILL_PROMPT], "decode": 1})
                cells[f"{m}|{q}"] = {"decode_tok_s": d["decode_tok_s"], "prefill_tok_s": p["prefill_tok_s"]}
        rounds.append({"cells": cells, "load_average": os.getloadavg()[0]})
        print(f"round {i + 1}: " + ", ".join(f"{k} {v['decode_tok_s']:.0f}" for k, v in cells.items()), flush=True)
    return {
        "date": today(),
        "machine": machine(args.threads),
        "settings": {
            "rounds": args.rounds,
            "inner": args.inner,
            "warmup": 1,
            "decode_prompt": DECODE_PROMPT,
            "decode_tokens": DECODE_TOKENS,
            "prefill_prompt": PREFILL_PROMPT,
        },
        "rounds": rounds,
        "priority": priority(),
        "seconds": round(time.perf_counter() - t0, 1),
    }


# ---------------------------------------------------------------- the command (the page: serving_report.py)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (and torch threads of the prune)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the speed part")
    p.add_argument("--inner", type=int, default=3, help="timed passes of each speed cell (their median)")
    p.add_argument("--report-only", action="store_true", help="rewrite the page from the JSON, run nothing")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--skip-speed", action="store_true", help="keep the JSON's speeds, measure the rest")
    group.add_argument("--only-speed", action="store_true", help="measure the speeds only, keep the rest")
    group.add_argument("--only-gemma", action="store_true", help="measure the Gemma 3 section only, keep the rest")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    data = json.loads(JSON.read_text()) if JSON.exists() else {}
    if args.only_gemma:
        data["quality"]["gemma3"] = gemma(args)
    elif not args.report_only:
        if not args.only_speed:
            data["quality"] = quality(args)
            data["summary"] = summary(data)
            JSON.write_text(json.dumps(data, indent=2))
        if not args.skip_speed:
            if "quality" not in data:
                sys.exit("no quality part in docs/results/serving.json yet: run without --only-speed first")
            data["speed"] = speed(args)
    data["summary"] = summary(data)
    JSON.write_text(json.dumps(data, indent=2))
    write(data)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
