"""Interleaved latency of dense and pruned SmolLM2-135M, for a CPU shared with other work.

``bench/speed.py latency`` measures each model in its own process, one after the other: on a quiet
machine that is the clean measurement, but when other jobs come and go on a small VM (2 cores here),
the load changes between models and their ratios mean little. This script holds every model in one
process and measures them round-robin — each round times every model in turn, each prefill the best
of ``--inner`` back-to-back runs — and reports the best time of every model over all rounds (other
work only ever adds time, so the least disturbed run is the best estimate) and the speed-up of best
times, beside the median over rounds of the per-round speed-up.

Measured per model: prefill (one forward pass building the KV cache) at batch 1 and 8 × 128 tokens;
greedy decoding at batch 1 after a 128-token prompt, eager with the dynamic KV cache (ms per step);
and with ``--compile`` the same decoding with a static KV cache through ``torch.compile`` (the forward
compiled once per model before the rounds; ``bench/compiled_decode.py``).

    python bench/speed_ab.py --models 0 0.2:64:free 0.2:64:whole 0.5:64:free 0.5:64:whole:6 --compile
    python bench/speed_ab.py --models 0 0.2:default 0.5:default 0.2:64:free --out docs/results/latency_default.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import smollm2_dir, wikipedia_split  # noqa: E402
from bench.common import best_time, machine, quiet_transformers, span, today  # noqa: E402
from bench.speed import build, greedy_steps  # noqa: E402
from bench.speed_report import _label, _machine_line  # noqa: E402

OUT = ROOT / "docs" / "results" / "latency_kv_groups.md"


def rounds(models: list, prompts: dict[str, Any], args, compiled: list | None) -> list[list[dict[str, float]]]:
    """``args.rounds`` rounds, each timing every model once in turn: seconds per prefill, ms per step."""
    import torch

    from bench.compiled_decode import static_decode

    out = []
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        row = []
        for i, model in enumerate(models):
            with torch.inference_mode():
                m = {
                    k: best_time(lambda ids=ids, model=model: model(input_ids=ids, use_cache=True), args.inner, 0)
                    for k, ids in prompts.items()
                }
                m["decode_ms"] = 1000 * statistics.median(greedy_steps(model, prompts["b1x128"], args.steps)[0])
            if compiled is not None and compiled[i] is not None:
                d = static_decode(model, prompts["b1x128"], args.steps, compiled=True, repeats=1, step=compiled[i])
                m["compiled_ms"] = d.get("ms_per_token_median", float("nan"))
            row.append(m)
        if r:
            out.append(row)
        args.loads.append(os.getloadavg()[0])
        print(f"round {r}: " + " | ".join(f"{m['b8x128']:.2f}s" for m in row), flush=True)
    return out


def summarise(measured: list[list[dict[str, float]]], rows: list[dict[str, Any]]) -> None:
    """Per model: its best time over the rounds, the speed-up of best times against model 0 (dense), and
    the median over rounds of the per-round speed-up."""
    for i, row in enumerate(rows):
        for key in measured[0][i]:
            row[key] = min(rnd[i][key] for rnd in measured)
            row[f"{key}_speedup"] = min(rnd[0][key] for rnd in measured) / row[key]
            row[f"{key}_speedup_median"] = statistics.median(rnd[0][key] / rnd[i][key] for rnd in measured)
            row[f"{key}_rounds"] = [rnd[i][key] for rnd in measured]


def write(rows: list[dict[str, Any]], args, mach: dict[str, Any], compile_errors: list[str]) -> Path:
    def cell(r: dict[str, Any], key: str, rate: float | None = None) -> str:
        if key not in r:
            return "–"
        value = rate / r[key] if rate else r[key]
        gain = "" if r["ratio"] == 0 else f" ({r[f'{key}_speedup']:.2f}×; {r[f'{key}_speedup_median']:.2f}×)"
        return f"{value:,.0f}{gain}" if rate else f"{value:.1f}{gain}"

    lines = [
        "# Latency of the default recipe's pruned models (SmolLM2-135M, CPU, interleaved)"
        if any(r.get("default") for r in rows)
        else "# Latency with whole key/value groups vs free query heads (SmolLM2-135M, CPU, interleaved)",
        "",
        f"Measured {today()} on {_machine_line(mach)}. Produced by "
        f"`python bench/speed_ab.py {' '.join(sys.argv[1:])}`.",
        "",
        f"1-minute load average after each round: {min(args.loads):.1f}–{max(args.loads):.1f} (this benchmark's own",
        f"{args.threads} threads count {args.threads}; more means other work ran beside it). Every model is measured",
        f"round-robin in one process ({args.rounds} rounds after a warm-up round, each prefill the best of",
        f"{args.inner} runs, each decoding the median of {args.steps} steps): the table gives each model's best",
        "over the rounds (other work only adds time) and, in brackets, the speed-up of best times; after",
        "the semicolon the median over rounds of the per-round speed-up.",
        "",
        "| model | parameters | query / kv heads per layer | FFN width | layers gathering k/v |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        heads, kv = r["heads_per_layer"], r.get("kv_heads_per_layer", [])
        lines.append(
            f"| {_label(r)} | {r['params']:,} | {span(heads)} / {span(kv)} | {span(r['ffn_per_layer'])} | "
            f"{r['kv_index_layers']} of {len(heads)} |"
        )
    lines += [
        "",
        "| model | prefill b1×128 tok/s | prefill b8×128 tok/s | decode b1 ms/step (eager) | "
        "decode b1 ms/step (compiled, static cache) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {_label(r)} | {cell(r, 'b1x128', 128)} | {cell(r, 'b8x128', 1024)} | {cell(r, 'decode_ms')} | "
            f"{cell(r, 'compiled_ms')} |"
        )
    if compile_errors:
        lines += ["", "Compilation failed: " + "; ".join(f"`{e}`" for e in compile_errors)]
    compile_s = ", ".join(f"{_label(r)} {r['compile_seconds']:.0f} s" for r in rows if "compile_seconds" in r)
    if compile_s:
        lines += ["", f"Compile time of the decode step (once per model, batch 1): {compile_s}."]
    out = Path(args.out)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"machine": mach, "rows": rows}, indent=2, default=str))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["0", "0.2:64:free", "0.2:64:whole", "0.5:64:free", "0.5:64:whole:6"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--inner", type=int, default=3, help="back-to-back prefill runs per round (the best counts)")
    p.add_argument("--steps", type=int, default=16, help="decoding steps per measurement")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prune-samples", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="also compiled decoding with a static KV cache")
    p.add_argument("--out", default=str(OUT), help="the page to write (its .json beside it)")
    args = p.parse_args()
    if args.models[0] != "0":
        sys.exit("the first model must be the dense one (0): speed-ups are against it")
    import torch

    torch.set_num_threads(args.threads)
    quiet_transformers()
    built = [build(spec, args.prune_samples) for spec in args.models]
    models, rows = [m for m, _, _ in built], [r for _, _, r in built]
    for model, row in zip(models, rows):
        n_kv = range(model.config.num_key_value_heads)
        row["kv_heads_per_layer"] = [len(getattr(ly.self_attn, "liar_kv_heads", n_kv)) for ly in model.model.layers]
    text = wikipedia_split()[1].read_text()[:200_000]
    from transformers import AutoTokenizer

    stream = AutoTokenizer.from_pretrained(str(smollm2_dir()))(text, return_tensors="pt")["input_ids"][0]
    prompts = {"b1x128": stream[:128][None], "b8x128": stream[: 8 * 128].reshape(8, 128)}
    compiled, errors = None, []
    if args.compile:
        from bench.compiled_decode import compile_step

        compiled = []
        for model, row in zip(models, rows):
            step, seconds, error = compile_step(model, prompts["b1x128"], args.steps)
            compiled.append(step)
            if error:
                errors.append(f"{_label(row)}: {error}")
            else:
                row["compile_seconds"] = seconds
    args.loads = []  # the machine's load after each round, for the page
    summarise(rounds(models, prompts, args, compiled), rows)
    print(f"wrote {write(rows, args, machine(args.threads), errors)}")


if __name__ == "__main__":
    main()
