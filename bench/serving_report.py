"""The page of ``bench/serving.py``: serving.md from the JSON's measurements, and the targets it states."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import spread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "serving.md"
JSON = OUT.with_suffix(".json")
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
TARGETS = {"ppl_f16": 0.01, "q4_over_f16": 0.10, "q4_size": 0.3, "decode_speedup": 1.4}


def ratio_of(model: str) -> float:
    return float(model.partition("-")[0])


def label(model: str) -> str:
    if model == "dense":
        return "dense"
    how = VARIANTS[model][0] if model in VARIANTS else ""
    return f"{ratio_of(model):.0%} removed{how}"


def gemma_lines(gemma: dict) -> list[str]:
    """The page's Gemma 3 section."""
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


def _file_lines(m: dict, models: list[str]) -> list[str]:
    """The page's section on the GGUF files: sizes, bytes per token, q4_k_m's tensor types."""
    lines = [
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
    return lines


def _speed_lines(data: dict, models: list[str]) -> list[str]:
    """The page's llama.cpp speed section."""
    s, m, sm = data["speed"], data["quality"]["models"], data["summary"]
    lines: list[str] = []
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
            lines.append(f"| {label(k)} | {quant} | {cols[0]} | {cols[1]} | {bytes_x:.2f}× | {cols[2]} | {cols[3]} |")
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
    return lines


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
    lines += _file_lines(m, models)
    if s:
        lines += _speed_lines(data, models)
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
