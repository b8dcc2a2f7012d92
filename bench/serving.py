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
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import CACHE, smollm2_dir, wikipedia_split  # noqa: E402
from bench.common import machine as torch_machine  # noqa: E402
from bench.common import spread  # noqa: E402

OUT = ROOT / "docs" / "results" / "serving.md"
JSON = OUT.with_suffix(".json")
WORK = CACHE / "serving"
RATIOS = (0.2, 0.5)
# the two levers for batch-1 decode at 50% beside the width-only default: 8 of the 30 blocks removed
# (least-squares stand-in) and the rest of the ratio in width; FFN widths in multiples of 256, so that
# llama.cpp's quantizer keeps them on Q4_K instead of falling back to Q5_0/Q8_0
VARIANTS = {  # key: (what the page's label adds, the recipe's fields over the default's)
    "0.5-depth8": (", 8 blocks + width", {"depth": {"blocks": 8, "reconstruction": "ls"}}),
    "0.5-r256": (", FFN widths × 256", {"round_to": {"neurons": 256}}),
}
MODELS = ("dense", *(f"{r:g}" for r in RATIOS), *VARIANTS)  # keys of the JSON's models
QUANTS = ("f16", "q4_k_m")  # measured for speed and on the page's main rows
DIAGNOSTIC = ("f32",)  # perplexity only: separates the file's conversion from the f16 rounding
SEQ_LEN, WINDOWS = 512, 20  # the later pages' protocol (bench/unseen.both_texts)
DECODE_PROMPT, DECODE_TOKENS, PREFILL_PROMPT = 128, 64, 512
TARGETS = {"ppl_f16": 0.01, "q4_over_f16": 0.10, "q4_size": 0.3, "decode_speedup": 1.4}


def label(model: str) -> str:
    if model == "dense":
        return "dense"
    how = VARIANTS[model][0] if model in VARIANTS else ""
    return f"{ratio_of(model):.0%} removed{how}"


def ratio_of(model: str) -> float:
    return float(model.partition("-")[0])


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
    from core.evaluation.perplexity import _windows

    return _windows(config, tokenizer, str(wikipedia_split()[1]), SEQ_LEN, WINDOWS).tolist()


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


def quality(args) -> dict:
    """Perplexity (ours and llama.cpp's), files and the pruned layouts of every model; Gemma 3's section."""
    import torch

    from core import perplexity
    from core.models.loading import load_model, load_pruned
    from core.serving.engines import call_llama_cpp

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
        if model == "dense":
            net, tok, _ = load_model(str(src), "float32", "cpu")
            row = {"achieved_ratio": 0.0}
        else:
            net, tok = load_pruned(src, dtype=torch.float32)
            row = json.loads((src / "prune.json").read_text())
        ours = perplexity(net, tok, str(wikipedia_split()[1]), seq_len=SEQ_LEN, batch_size=4, max_windows=WINDOWS)
        windows = eval_windows(tok, net.config)
        del net
        row |= {"checkpoint": src.name, "ours": ours["perplexity"], "ours_nll": ours["nll"], "tokens": ours["tokens"]}
        row["gguf"] = {}
        for quant, path in files.items():
            t = time.perf_counter()
            got = call_llama_cpp({"op": "nll", "model": str(path), "windows": windows, "threads": args.threads})
            assert got["tokens"] == ours["tokens"], (got["tokens"], ours["tokens"])
            row["gguf"][quant] = tensor_bytes(path) | {
                "file": path.name,
                "nll": got["nll"],
                "perplexity": math.exp(got["nll"] / got["tokens"]),
                "nll_seconds": round(time.perf_counter() - t, 1),
            }
            theirs = row["gguf"][quant]["perplexity"]
            print(f"{label(model)} {quant}: ours {ours['perplexity']:.3f}, llama.cpp {theirs:.3f}", flush=True)
        models[model] = row
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(row, indent=2))
    return {
        "date": dt.date.today().isoformat(),
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

    from core import perplexity
    from core.models.loading import load_model, load_pruned
    from core.serving.engines import call_llama_cpp
    from core.serving.gguf_export import export_gguf

    torch.set_num_threads(args.threads)
    rows = {}
    for key, fields in GEMMA.items():
        src = gemma_checkpoint(key, args.threads)
        if key == "dense":
            net, tok, _ = load_model(str(src), "float32", "cpu")
            row = {"achieved_ratio": 0.0}
        else:
            net, tok = load_pruned(src, dtype=torch.float32)
            row = json.loads((src / "prune.json").read_text()) | {"recipe": fields}
        ours = perplexity(net, tok, str(wikipedia_split()[1]), seq_len=SEQ_LEN, batch_size=2, max_windows=WINDOWS)
        windows = eval_windows(tok, net.config)
        del net
        row |= {"ours": ours["perplexity"], "tokens": ours["tokens"], "gguf": {}}
        for quant in QUANTS:
            path = WORK / "gguf" / f"gemma3-{key}-{quant}.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            export_gguf(src, path, quant=quant, threads=args.threads)
            got = call_llama_cpp({"op": "nll", "model": str(path), "windows": windows, "threads": args.threads})
            assert got["tokens"] == ours["tokens"], (got["tokens"], ours["tokens"])
            row["gguf"][quant] = tensor_bytes(path) | {"perplexity": math.exp(got["nll"] / got["tokens"])}
            print(f"Gemma 3 {label(key)} {quant}: ours {ours['perplexity']:.3f}, llama.cpp "
                  f"{row['gguf'][quant]['perplexity']:.3f}", flush=True)  # fmt: skip
        rows[key] = row
    return {"date": dt.date.today().isoformat(), "machine": machine(args.threads), "models": rows}


def gemma_lines(gemma: dict) -> list[str]:
    """The page's Gemma 3 section (a JSON from before the export wrote Gemma 3 holds its refusal)."""
    if "models" not in gemma:
        return ["", "## Gemma 3 270M", "", f"Refused by the export of that run: “{gemma['message']}”."]
    lines = [
        "",
        "## Gemma 3 270M",
        "",
        f"Measured {gemma['date']} (`python bench/serving.py --only-gemma`). llama.cpp's `gemma3` architecture "
        "states one width for every layer and no bias on the attention output or the FFN, so the pruned model "
        "is the default recipe with `allocation: uniform`, `round_to: {kv_groups: whole, neurons: 1}` and "
        "`reconstruction.method: mask_tuning` (no refit follows, so criterion auto is FLAP, whose scores pick the "
        "units; the export refuses the default's global allocation and least-squares biases before pruning, "
        "naming these settings). The pruned q4_k_m file is larger than the dense one: the kept FFN width is "
        "not a multiple of 32, so llama.cpp cannot quantise `ffn_down` (its rows are as long as the FFN is wide) "
        "and stores it at f16; `neurons: 256` would round each layer to whole Q4_K rows, but with uniform "
        "shares it rounds some layers down and some up, which the `gemma3` architecture cannot state. "
        "Perplexity on the same 20 windows of 512 tokens as above; no speed measured.",
        "",
        "| model | removed | architecture | ours (float32) | llama.cpp f16 | llama.cpp q4_k_m | f16 MiB | q4_k_m MiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key, row in gemma["models"].items():
        g = row["gguf"]
        lines.append(
            f"| {label(key)} | {row['achieved_ratio']:.1%} | `{g['f16']['arch']}` | {row['ours']:.2f} | "
            f"{g['f16']['perplexity']:.2f} | {g['q4_k_m']['perplexity']:.2f} | {g['f16']['mib']:.0f} | "
            f"{g['q4_k_m']['mib']:.0f} |"
        )
    return lines


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
        "date": dt.date.today().isoformat(),
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


# ---------------------------------------------------------------- the page


def speeds(data: dict, model: str, quant: str, key: str) -> list[float]:
    return [r["cells"][f"{model}|{quant}"][key] for r in data["speed"]["rounds"]]


def speedup(data: dict, model: str, quant: str, key: str) -> tuple[float, list[float]]:
    """Median over rounds of ``model`` over the median of dense; each round's own ratio."""
    a, b = speeds(data, model, quant, key), speeds(data, "dense", quant, key)
    return statistics.median(a) / statistics.median(b), [x / y for x, y in zip(a, b)]


def summary(data: dict) -> dict:
    """The targets' numbers (also written into the JSON)."""
    m = data["quality"]["models"]
    out = {
        "ppl_f16_rel_diff": {k: m[k]["gguf"]["f16"]["perplexity"] / m[k]["ours"] - 1 for k in MODELS if k in m},
        "q4_over_f16_50": m["0.5"]["gguf"]["q4_k_m"]["perplexity"] / m["0.5"]["gguf"]["f16"]["perplexity"] - 1,
        "q4_size_50_over_dense_f16": m["0.5"]["gguf"]["q4_k_m"]["mib"] / m["dense"]["gguf"]["f16"]["mib"],
        "bytes_ratio": {
            q: m["dense"]["gguf"][q]["tensor_bytes"] / m["0.5"]["gguf"][q]["tensor_bytes"] for q in (*QUANTS, "f32")
        },
    }
    if data.get("speed"):
        out["decode_speedup_50"] = {q: speedup(data, "0.5", q, "decode_tok_s")[0] for q in QUANTS}
        out["decode_speedup_levers"] = {  # the 50% variants, where this run measured them
            k: {q: speedup(data, k, q, "decode_tok_s")[0] for q in QUANTS} for k in VARIANTS if measured(data, k)
        }
        out["decode_fit"] = {q: decode_fit(data, q) for q in QUANTS}
    return out


def measured(data: dict, model: str) -> bool:
    """Whether the page's data holds ``model`` (a page written before the 50% variants has not)."""
    return model in data["quality"]["models"] and all(
        f"{model}|{q}" in r["cells"] for r in data.get("speed", {}).get("rounds", []) for q in QUANTS
    )


def _span(blocks: list[int]) -> str:
    return f"{blocks[0]}–{blocks[-1]}"


def width_models(data: dict) -> list[str]:
    """The measured models that keep all 30 blocks (the decode fit's points)."""
    return [k for k in MODELS if "depth" not in model_fields(k) and measured(data, k)]


def model_fields(model: str) -> dict:
    """The recipe fields a model key's variant sets (none for dense and the default's ratios)."""
    return VARIANTS[model][1] if model in VARIANTS else {}


def decode_fit(data: dict, quant: str) -> dict:
    """Least squares of the 30-block models' median ms per decoded token against their weight MiB."""
    keys = width_models(data)
    xs = [data["quality"]["models"][k]["gguf"][quant]["tensor_bytes"] / 2**20 for k in keys]
    ys = [1000 / statistics.median(speeds(data, k, quant, "decode_tok_s")) for k in keys]
    slope, fixed = statistics.linear_regression(xs, ys)
    return {"fixed_ms": fixed, "ms_per_mib": slope}


def write(data: dict) -> None:
    q, s = data["quality"], data.get("speed")
    m, mq = q["models"], q["machine"]
    data["summary"] = summary(data)
    sm = data["summary"]
    models = [k for k in MODELS if measured(data, k)]
    lines = [
        "# Serving the pruned model in stock llama.cpp: GGUF export (SmolLM2-135M)",
        "",
        f"Measured {q['date']} on {mq['cpu']}, {mq['cores']} cores shared with other work, torch {mq['torch']}, "
        f"transformers {mq['transformers']}, llama-cpp-python {mq['llama_cpp_python']} (its own llama.cpp, "
        f"CPU build), {mq['threads']} threads. Produced by `python bench/serving.py`.",
        "",
        "SmolLM2-135M-Instruct dense and pruned by the default recipe (`criterion: auto` → obs, `allocation:",
        "global`; 128 × 128 calibration tokens of the Wikipedia calibration articles, as `obs_allocation.md`),",
        "saved as checkpoints and exported with `export_gguf` (`liar export CKPT --format gguf`): f16 and f32",
        "written by the exporter, q4_k_m by llama.cpp's quantizer from the f16 file. Perplexity on the first",
        f"{q['protocol']['windows']} windows of {q['protocol']['seq_len']} tokens of the held-out Wikipedia "
        "articles (the later pages' protocol): ours is",
        "`core.perplexity` on the saved checkpoint in float32 (torch); llama.cpp's is computed from its own",
        "logits on the same token ids (`core/serving/llama_cpp_worker.py`, op `nll`).",
        "",
        "## Perplexity: llama.cpp against ours",
        "",
        "| model | removed | GGUF architecture | ours (float32) | llama.cpp f32 | llama.cpp f16 | f16 vs ours "
        "| llama.cpp q4_k_m | q4_k_m vs f16 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in models:
        r, g = m[k], m[k]["gguf"]
        lines.append(
            f"| {label(k)} | {r['achieved_ratio']:.2%} | `{g['f16']['arch']}` | {r['ours']:.3f} "
            f"| {g['f32']['perplexity']:.3f} | {g['f16']['perplexity']:.3f} | {sm['ppl_f16_rel_diff'][k]:+.3%} "
            f"| {g['q4_k_m']['perplexity']:.3f} | {g['q4_k_m']['perplexity'] / g['f16']['perplexity'] - 1:+.2%} |"
        )
    lines += ["", "Kept query heads / key-value heads / FFN width per layer (dense: 9/3/1536):", ""]
    lines += [
        f"- {label(k)}: "
        + (f"blocks {_span(m[k]['removed_blocks'])} removed; " if m[k].get("removed_blocks") else "")
        + " ".join(f"{h}/{kv}/{n}" for h, kv, n in m[k]["layers"])
        for k in models
        if k != "dense"
    ]
    lines += [
        "",
        "## Files",
        "",
        "Weight bytes per decoded token: every tensor of the file (the tied embedding is read whole as the",
        "output head; one row of it as the embedding). × dense: the dense file's bytes over this one's, the",
        "decode speed-up that reading the weights alone would allow.",
        "",
        "| model | f16 MiB | q4_k_m MiB | f32 MiB | f16 weight bytes per token | × dense | q4_k_m weight bytes per "
        "token | × dense | embedding/head in q4_k_m |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in models:
        g, d = m[k]["gguf"], m["dense"]["gguf"]
        lines.append(
            f"| {label(k)} | {g['f16']['mib']:.1f} | {g['q4_k_m']['mib']:.1f} | {g['f32']['mib']:.1f} "
            f"| {g['f16']['tensor_bytes'] / 2**20:.1f} MiB "
            f"| {d['f16']['tensor_bytes'] / g['f16']['tensor_bytes']:.2f}× "
            f"| {g['q4_k_m']['tensor_bytes'] / 2**20:.1f} MiB "
            f"| {d['q4_k_m']['tensor_bytes'] / g['q4_k_m']['tensor_bytes']:.2f}× "
            f"| {g['q4_k_m']['embedding'][0]}, {g['q4_k_m']['embedding'][1] / 2**20:.1f} MiB |"
        )
    lines += [
        "",
        "q4_k_m's block matrices by type (llama.cpp's quantizer falls back from Q4_K/Q6_K where a row is not a "
        "multiple of 256 long: SmolLM2's hidden size 576 already, and pruned FFN widths and head counts): "
        + "; ".join(
            f"{label(k)} "
            + ", ".join(
                f"{t} {b / 2**20:.1f} MiB"
                for t, b in sorted(m[k]["gguf"]["q4_k_m"]["block_matrix_types"].items(), key=lambda x: -x[1])
            )
            for k in models
        )
        + ".",
    ]
    if s:
        ms, st = s["machine"], s["settings"]
        loads = [r["load_average"] for r in s["rounds"]]
        lines += [
            "",
            "## Speed in llama.cpp",
            "",
            f"Measured {s['date']} on {ms['cpu']}, {ms['cores']} cores **shared with other work**"
            + (
                f", this benchmark at {s['priority']} priority (the other work got at most the kernel's 5% "
                "real-time reserve; the load average below counts it waiting)"
                if s.get("priority", "normal") != "normal"
                else ""
            )
            + ", llama-cpp-python "
            f"{ms['llama_cpp_python']}, {ms['threads']} threads. Batch-1 greedy decode: a {st['decode_prompt']}-token "
            f"prompt, then {st['decode_tokens']} tokens; prefill: a {st['prefill_prompt']}-token prompt. Each cell is "
            f"a fresh llama.cpp process: {st['warmup']} warm-up pass, then the median of {st['inner']}. The models "
            "run interleaved within each round (in the table's order; f16, then q4_k_m); the table gives the median "
            "over "
            f"{st['rounds']} rounds and, in brackets, the spread (min–max). × dense: median over median, then the "
            f"range of the per-round ratios. 1-minute load average after each round: {min(loads):.1f}–{max(loads):.1f} "
            f"(this benchmark's own {ms['threads']} threads count {ms['threads']}).",
            "",
            "| model | GGUF | decode tokens/s | × dense | weight bytes × dense | prefill tokens/s | × dense |",
            "|---|---|---|---|---|---|---|",
        ]
        for quant in QUANTS:
            for k in models:
                g = m[k]["gguf"][quant]
                bytes_x = m["dense"]["gguf"][quant]["tensor_bytes"] / g["tensor_bytes"]
                cols = []
                for key in ("decode_tok_s", "prefill_tok_s"):
                    x, per = speedup(data, k, quant, key)
                    rel = "–" if k == "dense" else f"{x:.2f}× ({min(per):.2f}–{max(per):.2f})"
                    cols += [spread(speeds(data, k, quant, key)), rel]
                lines.append(
                    f"| {label(k)} | {quant} | {cols[0]} | {cols[1]} | {bytes_x:.2f}× | {cols[2]} | {cols[3]} |"
                )
        fits = sm["decode_fit"]
        lines += [
            "",
            "Why the decode speed-up stays below the bytes ratio: a line through the 30-block models' median time "
            "per decoded token against their weight bytes gives "
            + "; ".join(f"{q} {fits[q]['fixed_ms']:.1f} ms + {fits[q]['ms_per_mib']:.4f} ms per MiB" for q in QUANTS)
            + ". The fixed part is per-token work that removing units does not shorten (all 30 layers stay, "
            "each with its operations, thread synchronisation and the attention over the cache; the Python "
            "decode loop): an estimate from three points, not a profile.",
        ]
    lines += gemma_lines(q["gemma3"])
    lines += [
        "",
        "## Targets",
        "",
    ]
    lines += targets(data)
    OUT.write_text("\n".join(lines) + "\n")


def targets(data: dict) -> list[str]:
    sm, m = data["summary"], data["quality"]["models"]

    def met(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    diffs = sm["ppl_f16_rel_diff"]
    worst = max(abs(x) for x in diffs.values())
    out = [
        f"- llama.cpp's perplexity at f16 within {TARGETS['ppl_f16']:.0%} of ours: {met(worst <= TARGETS['ppl_f16'])} "
        "(" + "; ".join(f"{label(k)} {x:+.3%}" for k, x in diffs.items()) + ").",
        f"- the 50% model's q4_k_m perplexity within {TARGETS['q4_over_f16']:.0%} of its f16: "
        f"{met(abs(sm['q4_over_f16_50']) <= TARGETS['q4_over_f16'])} "
        f"({m['0.5']['gguf']['q4_k_m']['perplexity']:.2f} vs {m['0.5']['gguf']['f16']['perplexity']:.2f}, "
        f"{sm['q4_over_f16_50']:+.2%}).",
        f"- the 50% model's q4_k_m file at most {TARGETS['q4_size']}× the dense f16 file: "
        f"{met(sm['q4_size_50_over_dense_f16'] <= TARGETS['q4_size'])} "
        f"({m['0.5']['gguf']['q4_k_m']['mib']:.1f} of {m['dense']['gguf']['f16']['mib']:.1f} MiB, "
        f"{sm['q4_size_50_over_dense_f16']:.3f}×).",
    ]
    if "decode_speedup_50" in sm:
        for q in QUANTS:
            x = sm["decode_speedup_50"][q]
            out.append(
                f"- the 50% model's decode ≥ {TARGETS['decode_speedup']}× the dense one's at {q}: "
                f"{met(x >= TARGETS['decode_speedup'])} ({x:.2f}×; its weight bytes per token allow "
                f"{sm['bytes_ratio'][q]:.2f}×)."
            )
        for k, by_quant in sm.get("decode_speedup_levers", {}).items():  # what the two levers give at 50%
            x, ppl = by_quant["q4_k_m"], m[k]["gguf"]["q4_k_m"]["perplexity"]
            out.append(
                f"  - {label(k)}: {met(x >= TARGETS['decode_speedup'])} at q4_k_m ({x:.2f}×, f16 "
                f"{by_quant['f16']:.2f}×), at a q4_k_m perplexity of {ppl:.1f} against the width-only "
                f"{m['0.5']['gguf']['q4_k_m']['perplexity']:.1f}."
            )
    else:
        out.append("- decode speed-ups: not measured in this run (`python bench/serving.py --only-speed`).")
    return out


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
