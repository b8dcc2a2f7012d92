"""The pages of ``bench/speed.py``: time.md and latency.md from their rows (``--report-only``: from the JSON)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import span, today
from bench.pages.values import floor_seconds

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# The paper's Table (time consumption, minutes, one NVIDIA Tesla A100 80G, LIAR reconstruction).
PAPER_MINUTES: dict[str, dict[int, float]] = {
    "LLaMA-7B": {128: 1.0, 256: 1.5, 512: 2.1, 1024: 3.9},
    "LLaMA-13B": {128: 3.1, 256: 3.8, 512: 4.9, 1024: 7.9},
    "LLaMA-30B": {128: 6.6, 256: 8.5, 512: 12.7, 1024: 19.7},
}
# the GPU runs' pages quoted where they exist (gpu_liar.md is committed)
GPU_RESULTS = (("LLaMA-7B", "gpu_liar.md"), ("LLaMA-13B", "gpu_liar_13b.md"))


def _machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} (CPU) with `torch.set_num_threads({m['torch_threads']})`, "
        f"transformers {m['transformers']}"
    )


def _out_paths(args: argparse.Namespace, name: str) -> Path:
    if getattr(args, "isa", "default") != "default":
        name = f"{name}_{args.isa}"
    if args.out:
        return Path(args.out)
    if args.quick:
        return Path(tempfile.mkdtemp(prefix="liar-speed-")) / f"{name}.md"
    return RESULTS / f"{name}.md"


def _gpu_section() -> list[str]:
    lines = ["## GPU: LLaMA-7B/13B-shaped models (`bench/gpu_liar.py`)", ""]
    for name, file in GPU_RESULTS:
        path = RESULTS / file
        if path.is_file():
            lines += [f"From `docs/results/{file}` ({name}):", ""]
            lines += ["#" + x if x.startswith("#") else x for x in path.read_text().strip().splitlines()]
            lines.append("")
    return lines


def _library(rows: list[dict[str, Any]]) -> str:
    """Which library the points' float32 products ran through (``core/kernels/cpu_matmul.py``)."""
    names = {r["cpu_matmul"] for r in rows}
    return "; float32 products through " + " / ".join(sorted("oneDNN" if n == "onednn" else "the BLAS" for n in names))


def _products_cells(r: dict[str, Any]) -> str:
    """The row's cells from ``GEMM`` on: the products at the GEMM rate, the model's forward, the products
    at their own shapes, and the floor."""
    floor = floor_seconds(r)
    return (
        f"{r['gemm_gflops']:.0f} | {r['product_tflop']:.2f} | {r['product_seconds']:.1f} | "
        f"{r['ratio_to_products']:.2f} | {r['forward_seconds']:.1f} | {r['forward_ratio_to_products']:.2f} | "
        f"{r['prune_over_forward']:.2f} | {r['own_product_seconds']:.1f} | {r['ratio_to_own_products']:.2f} | "
        f"{r['forward_ratio_to_own_products']:.2f} | {floor:.1f} | {r['prune_seconds'] / floor:.2f}"
    )


def _paper_lines() -> list[str]:
    """The page's section quoting the paper's time-consumption table."""
    counts = sorted({n for table in PAPER_MINUTES.values() for n in table})
    lines = [
        "",
        "## The paper's table",
        "",
        "LIAR reconstruction time in **minutes** on one NVIDIA Tesla A100 80G, from the paper's time-consumption",
        'table ("Time consumption (minutes) for reconstructing LLaMA models with different numbers of calibration',
        'samples"); the paper states neither the sample length nor the pruning ratio of these runs. In brackets:',
        "relative to 128 samples.",
        "",
        "| model | " + " | ".join(str(n) for n in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    for model, table in PAPER_MINUTES.items():
        cells = [f"{table[n]} ({table[n] / table[128]:.1f}×)" for n in counts]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The absolute numbers are not comparable (a 135M-parameter model on a CPU here, 7–30B models on an A100",
        "there); the scaling with the number of samples is. Solves depend only on the layer widths, not on the",
        "samples, so the per-sample cost is the statistics and block passes.",
        "",
    ]
    return lines


def write_time(rows: list[dict[str, Any]], args: argparse.Namespace, mach: dict[str, Any], date: str = "") -> Path:
    out = _out_paths(args, "time")
    out.parent.mkdir(parents=True, exist_ok=True)
    base = next((r for r in rows if r["samples"] == 128), None)
    date = date or today()
    lines = [
        "# Reconstruction time vs calibration samples",
        "",
        f"Measured {date} on {_machine_line(mach)}. "
        f"Produced by `python bench/speed.py time{' --quick' if args.quick else ''}`"
        + (" (**smoke test, not a measurement**)" if args.quick else "")
        + ".",
        "",
        "SmolLM2-135M-Instruct (float32, CPU, in memory), paper-exact LIAR (damp 0.001; the magnitude criterion",
        f"chooses the units, `select: criterion`), ratio {args.ratio}, heads +",
        f"neurons, uniform allocation; calibration windows of {args.seq_len} tokens from the Wikipedia calibration",
        f"articles, batches of {args.batch_size}, plus 8 held-aside windows for the error report. Each point runs in",
        "its own process with the model loaded before the clock starts"
        + _library(rows)
        + (
            "."
            if getattr(args, "activations", "auto") == "auto"
            else f"; `activations: {args.activations}` (`--activations {args.activations}`)."
        ),
        "",
        "- `prune`: wall time of `core.prune` — calibration tokenisation, scoring, and for every one of the 30",
        "  layers: streaming the o_proj / down_proj input statistics, solving, surgery, and the pass that feeds",
        "  the next layer.",
        "- `per-layer`: the sum of the report's per-projection `seconds` (statistics pass + solve + surgery).",
        "- `solves`: `reconstruct_from_stats` for LIAR alone (60 calls: the Cholesky solves and the projection).",
        "- `× 128`: time relative to 128 samples, to compare the scaling with the paper's.",
        "- `page faults`: minor page faults during the prune (fresh pages the allocator asked the OS for);",
        "  `load`: the machine's 1-minute load average when the point ended (2 cores: above 2, it was shared).",
        "- `GEMM`: GFLOP/s of one 2048² float32 product through the route the run's projections took, measured",
        "  in the same process after the prune; `products`: the run's matrix products (TFLOP, counted on a second,",
        "  untimed prune: `bench/flops.py`), and the seconds they need at that rate; `prune / products`: how far",
        "  the prune is from a run that does nothing but its products at the rate of a large square one.",
        "- `forward`: the model's own `transformers` forward over as many windows, in the same batches, timed in",
        "  the same process; `forward / products`: its time over its own products' at the same rate — what this",
        "  CPU gives the model's mix of products and memory-bound work (norms, rotary, activations, attention),",
        "  which no prune, being at least one such pass, can beat; `prune / forward`: the prune in those passes.",
        "- `own shapes`: the same products each timed alone at its own shapes, strides and dtype on random",
        "  operands (every distinct product, the best of 3 after a warm-up, times how often the run made it), in",
        "  the same process: what the products need on this CPU, where a product with a short side (576 channels,",
        "  128-token attention) runs below the square product's rate; `prune / own` and `forward / own` likewise.",
        "- `floor`: the model's own forward (`forward s`) plus the products the prune makes beyond that forward's",
        "  (statistics, solves, the error report), each at its own shape: the least a prune that runs the model",
        "  once can take here; `prune / floor`: what the prune spends beyond it (its own memory-bound work:",
        "  gathering, masking, casting and folding the statistics, surgery).",
        "",
        "| samples | tokens | prune s | × 128 | per-layer s | solves s | peak RSS MB | page faults | load "
        "| GEMM GFLOP/s | products TFLOP | products s | prune / products | forward s | forward / products "
        "| prune / forward | own shapes s | prune / own | forward / own | floor s | prune / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r['prune_seconds'] / base['prune_seconds']:.2f}" if base else "–"
        lines.append(
            f"| {r['samples']} | {r['tokens']:,} | {r['prune_seconds']:.1f} | {rel} | {r['layer_seconds']:.1f} | "
            f"{r['solve_seconds']:.2f} | {r['peak_rss_mb']:.0f} | {r['page_faults'] / 1e6:.2f} M | "
            f"{r['load_average']:.1f} | {_products_cells(r)} |"
        )
    lines += _paper_lines()
    lines += _gpu_section()
    out.write_text("\n".join(lines))
    payload = {
        "date": date,
        "machine": mach,
        "args": {k: v for k, v in vars(args).items() if k not in ("func", "report_only")},
        "rows": rows,
        "paper_a100_minutes": PAPER_MINUTES,
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    return out


def _label(r: dict[str, Any]) -> str:
    if r["ratio"] == 0:
        return "dense"
    if r.get("default"):
        return f"pruned {r['ratio']:.0%}, the default recipe ({r['achieved_ratio']:.1%} removed)"
    rounded = f", FFN widths ×{r['round_neurons']}" if r.get("round_neurons", 1) > 1 else ""
    rounded += ", whole kv groups" if r.get("kv_groups") == "whole" else ""
    rounded += f", heads ×{r['round_heads']}" if r.get("round_heads", 1) > 1 else ""
    return f"pruned {r['ratio']:.0%}{rounded} ({r['achieved_ratio']:.1%} removed)"


def write_latency(rows: list[dict[str, Any]], args: argparse.Namespace, mach: dict[str, Any]) -> Path:
    out = _out_paths(args, "latency")
    out.parent.mkdir(parents=True, exist_ok=True)
    dense = next((r for r in rows if r["ratio"] == 0), None)
    lines = [
        "# Inference throughput and latency: dense vs pruned SmolLM2-135M",
        "",
        f"Measured {today()} on {_machine_line(mach)}. "
        f"Produced by `python bench/speed.py {' '.join(sys.argv[1:]) or 'latency'}`"
        + (" (**smoke test, not a measurement**)" if args.quick else "")
        + ".",
        "",
        "SmolLM2-135M-Instruct in float32 on the CPU. Pruned models come from `core.prune` in memory (LIAR",
        "with the default OBS selection, magnitude criterion, heads + neurons, uniform allocation,",
        f"{args.prune_samples} calibration windows — the",
        "widths, and so the speed, do not depend on the number of windows). Layers whose kept query heads no",
        "longer form equal key/value groups gather their key/value heads through a per-layer index (counted",
        "below). Rows marked `FFN widths ×N` were pruned with `round_to: {neurons: N}` (kept FFN widths",
        "rounded to multiples of N, the budget held); `whole kv groups` with `round_to: {kv_groups: whole}`",
        "(query heads dropped only as whole key/value groups: no layer gathers), `heads ×N` with",
        "`round_to: {heads: N}`. Each model is measured in its own process:",
        f"{args.warmup} warm-up run(s), then the median of {args.repeats} repeats, `torch.inference_mode()`.",
        "",
        "- Prefill: one forward pass over the prompt building the KV cache; tokens/s = batch × prompt / time.",
        f"- Decode: batch 1, a {args.decode_prompt}-token prompt, then {args.new_tokens} greedy steps of one token",
        "  each with the KV cache (a hand-written loop, each step timed); tokens/s = steps / median total.",
        f"- generate: `model.generate(max_new_tokens={args.new_tokens}, do_sample=False)` end to end (prefill",
        "  included); it must produce the same tokens as the loop.",
        "",
        "| model | parameters | query heads per layer | FFN width per layer | layers with a key/value index |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {_label(r)} | {r['params']:,} | {span(r['heads_per_layer'])} | {span(r['ffn_per_layer'])} | "
        f"{r['kv_index_layers']} of {len(r['heads_per_layer'])} |"
        for r in rows
    ]
    keys = [(p["batch"], p["prompt"]) for p in rows[0]["prefill"]]
    lines += [
        "",
        "## Prefill tokens/s (speed-up vs dense)",
        "",
        "| model | " + " | ".join(f"batch {b}, prompt {n}" for b, n in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for r in rows:
        cells = []
        for p in r["prefill"]:
            ref = next((d for d in dense["prefill"] if (d["batch"], d["prompt"]) == (p["batch"], p["prompt"])), None)
            gain = f" ({p['tokens_per_s'] / ref['tokens_per_s']:.2f}×)" if ref and r is not dense else ""
            cells.append(f"{p['tokens_per_s']:,.0f}{gain}")
        lines.append(f"| {_label(r)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Decoding (batch 1)",
        "",
        "| model | decode tokens/s | ms/token (median) | ms/token (p90) | generate tokens/s | same tokens as loop |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, g = r["decode"], r["generate"]
        gain = f" ({d['tokens_per_s'] / dense['decode']['tokens_per_s']:.2f}×)" if dense and r is not dense else ""
        lines.append(
            f"| {_label(r)} | {d['tokens_per_s']:.1f}{gain} | {d['ms_per_token_median']:.1f} | "
            f"{d['ms_per_token_p90']:.1f} | {g['tokens_per_s']:.1f} | {'yes' if g['matches_manual_loop'] else 'NO'} |"
        )
    lines += _static_lines(rows, dense, args)
    lines.append("")
    out.write_text("\n".join(lines))
    payload = {
        "date": today(),
        "machine": mach,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "rows": rows,
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    return out


def _static_lines(rows: list[dict[str, Any]], dense: dict[str, Any] | None, args: argparse.Namespace) -> list[str]:
    """The static-cache decoding table (``--compile``): ms/token eager and compiled per batch size."""
    if not any(r.get("static_decode") for r in rows):
        return []
    batches = [d["batch"] for d in rows[0]["static_decode"]]
    lines = [
        "",
        "## Decoding with a static KV cache: eager and compiled",
        "",
        f"A `StaticCache` of prompt + {args.new_tokens} tokens, the {args.decode_prompt}-token prompt prefilled",
        "eagerly, then greedy steps through the model's forward, eager or `torch.compile(dynamic=False)`",
        "(Inductor, C++ on the CPU): median ms per step over 3 runs after a warm-up run (which compiles;",
        "its time in brackets). Speed-up vs the dense model in brackets; `same` = the compiled steps",
        "produced the eager steps' tokens.",
        "",
        "| model | " + " | ".join(f"b{b} eager ms/step | b{b} compiled ms/step" for b in batches) + " | same |",
        "|---|" + "---|---|" * len(batches) + "---|",
    ]
    ref = {d["batch"]: d for d in (dense or {}).get("static_decode", [])}

    def cell(d: dict[str, Any], base: dict[str, Any] | None, compiled: bool) -> str:
        if "error" in d:
            return f"failed: `{d['error']}`"
        gain = (
            ""
            if base is None or "error" in base
            else f" ({base['ms_per_token_median'] / d['ms_per_token_median']:.2f}×)"
        )
        warm = f" [compile {d['compile_seconds']:.0f} s]" if compiled else ""
        return f"{d['ms_per_token_median']:.1f}{gain if base is not d else ''}{warm}"

    for r in rows:
        cells = []
        for d in r.get("static_decode", []):
            base = ref.get(d["batch"])
            cells += [
                cell(d["eager"], base and base["eager"], False),
                cell(d["compiled"], base and base["compiled"], True),
            ]
        same = all(d["same_tokens"] for d in r.get("static_decode", []))
        lines.append(f"| {_label(r)} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    return lines
