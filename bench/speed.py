"""Speed benchmarks on SmolLM2-135M on the CPU: reconstruction time and inference throughput / latency.

``time`` — wall time of prune + reconstruct (LIAR, magnitude criterion, ratio 0.2, heads + neurons)
against the number of calibration samples {128, 256, 512, 1024} × 128 tokens, with the time of the
reconstruction solves alone, beside the paper's A100 table for LLaMA-7B/13B/30B; includes the GPU run
of ``bench/gpu_liar.py`` when its results exist. Writes docs/results/time.md + time.json.

``latency`` — dense vs pruned (ratios 0.2 and 0.5, LIAR; each with exact kept widths and with FFN
widths rounded to multiples of 64, ``--round-neurons``; query heads free or in whole key/value groups,
``--kv-groups``) SmolLM2: prefill tokens/s (batch 1 and 8, prompts of 128 and 512 tokens), greedy
decoding with the KV cache (batch 1, 64 new tokens): decode tokens/s and per-token latency, and
``model.generate`` end to end; with ``--compile``, decoding with a static KV cache, eager and compiled
(``torch.compile``), at each ``--decode-batches``. Warm-up runs, then the median of repeats. Writes
docs/results/latency.md + latency.json.

Each measured configuration runs in its own process (peak memory is that run's). Timings mean
something only on an otherwise idle machine.

    make bench-time        # python bench/speed.py time    [--samples 128 256 512 1024] [--threads N]
    make bench-latency     # python bench/speed.py latency [--ratios 0.2 0.5] [--round-neurons 1 64] [--threads N]
    python bench/speed.py latency --round-neurons 64 --kv-groups free whole --compile --prompts 128
    python bench/speed.py time --quick       # smoke test: one small point, results to a temp folder
    python bench/speed.py latency --quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import smollm2_dir, wikipedia_split  # noqa: E402
from bench.common import child_result, configure_as_cli, flags, machine, median_time, quiet_transformers  # noqa: E402
from bench.speed_report import _label, _machine_line, _out_paths, write_latency, write_time  # noqa: E402
from core.spec.recipe import ACTIVATIONS  # noqa: E402

SAMPLES = (128, 256, 512, 1024)
# the options of ``latency`` each model's measuring process gets as they were given
LATENCY_PASSED = ("decode_prompt", "new_tokens", "warmup", "repeats", "prune_samples", "batches", "prompts")
LATENCY_PASSED += ("decode_batches", "compile")
# ``--isa avx2``: the kernels a CPU without AVX-512 runs (torch's own and oneDNN's capped at AVX2), set
# in each measuring process before torch starts
ISA_ENV: dict[str, dict[str, str]] = {
    "default": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def _child(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Run this script in a fresh process for one measurement; returns its RESULT line."""
    cmd = [sys.executable, __file__, args.command, "--threads", str(args.threads), *extra]
    return child_result(cmd, f"measurement {' '.join(extra)}", ISA_ENV[getattr(args, "isa", "default")])


def _recipe(samples: int, seq_len: int, ratio: float, batch_size: int, activations: str = "auto") -> dict[str, Any]:
    calib, _ = wikipedia_split()
    return {
        "activations": activations,
        "model": str(smollm2_dir()),
        "ratio": ratio,
        "modules": "both",
        "criterion": {"name": "magnitude"},
        # the paper's LIAR: the criterion chooses the units (not the default's OBS selection)
        "reconstruction": {"method": "liar", "damp": 1e-3, "select": "criterion"},
        "round_to": {"neurons": 1},  # exact widths, as the time table has always been measured
        "dtype": "float32",
        "device": "cpu",
        "calibration": {
            "dataset": str(calib),
            "num_calibration_samples": samples,
            "max_seq_length": seq_len,
            "holdout_samples": 8,
            "seed": 0,
            "batch_size": batch_size,
        },
    }


# --- (a) reconstruction time vs calibration samples ----------------------------------------------------
def time_one(args: argparse.Namespace) -> dict[str, Any]:
    """One point: load SmolLM2, then time ``core.prune`` with the model already in memory."""
    import torch

    import core.pipeline.fitting as fitting
    import core.pipeline.sequential as pipeline
    from core.kernels import cpu_matmul
    from core.models.loading import load_model

    torch.set_num_threads(args.threads)
    quiet_transformers()
    configure_as_cli()
    recipe = _recipe(args.one, args.seq_len, args.ratio, args.batch_size, args.activations)
    t0 = time.perf_counter()
    model, tok, _ = load_model(recipe["model"], "float32", "cpu")
    load_s = time.perf_counter() - t0

    solves: list[float] = []
    real = fitting.reconstruct_from_stats

    def timed(method, *a, **kw):  # the solve of the recipe's method; 'none' (the error baseline) is a slice
        t = time.perf_counter()
        out = real(method, *a, **kw)
        if method == recipe["reconstruction"]["method"]:
            solves.append(time.perf_counter() - t)
        return out

    fitting.reconstruct_from_stats = timed
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        t0 = time.perf_counter()
        result = pipeline.prune(recipe, model=model, tokenizer=tok)
        wall = time.perf_counter() - t0
    finally:
        fitting.reconstruct_from_stats = real
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    per_layer = sum(r.seconds for r in result.report)
    products = _products(recipe, wall)
    return {
        "samples": args.one,
        "seq_len": args.seq_len,
        "tokens": args.one * args.seq_len,
        "load_seconds": load_s,
        "prune_seconds": wall,
        "layer_seconds": per_layer,
        "solve_seconds": sum(solves),
        "solves": len(solves),
        "other_seconds": wall - per_layer,
        "achieved_ratio": result.achieved_ratio,
        "peak_rss_mb": result.peak_memory_mb,
        "page_faults": faults,  # minor faults during the prune: fresh pages the allocator asked for
        "load_average": os.getloadavg()[0],  # the machine's 1-minute load when the point ended
        "mean_error_after": sum(r.error_after for r in result.report) / len(result.report),
        "activations": result.metrics["activations"],
        **cpu_matmul.decision().metrics(),  # which library multiplied the float32 products, and why
        "isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "default"),
        **products,
    }


def _products(recipe: dict[str, Any], wall: float) -> dict[str, Any]:
    """The run's matrix products against the machine: the GEMM rate of a 2048² float32 product through
    the route the engine's projections took, measured now, and the products' multiply-adds counted on
    a second, untimed prune of a fresh copy of the model (``bench/flops.py``)."""
    import torch.nn.functional as F

    import core.pipeline.sequential as pipeline
    from bench.flops import ProductCounter, gemm_rate
    from core.kernels import cpu_matmul
    from core.models.loading import load_model

    rate = gemm_rate(cpu_matmul.linear if cpu_matmul.backend() == "onednn" else F.linear)
    model, tok, _ = load_model(recipe["model"], "float32", "cpu")
    forward = _forward(model, recipe, rate)  # on the dense copy, before it is pruned
    with ProductCounter(shapes=True) as counter:
        pipeline.prune(recipe, model=model, tokenizer=tok)
    seconds = 2 * counter.macs / (rate * 1e9)
    own, distinct = counter.replayed_seconds()
    return {
        "gemm_gflops": rate,
        "product_tflop": 2 * counter.macs / 1e12,
        "product_tflop_by_op": {op: 2 * m / 1e12 for op, m in counter.by_op.items()},
        "product_seconds": seconds,  # the products alone, each at the measured rate
        "ratio_to_products": wall / seconds,
        "own_product_seconds": own,  # the products alone, each timed at its own shape (bench/flops.py)
        "distinct_products": distinct,
        "ratio_to_own_products": wall / own,
        **forward,
        "prune_over_forward": wall / forward["forward_seconds"],
    }


def _forward(model, recipe: dict[str, Any], rate: float) -> dict[str, Any]:
    """The model's own forward pass (``transformers``' code, no engine) over as many windows as the
    prune's calibration set, in its batches: timed once after a one-batch warm-up, and its products
    counted on a second pass. Its time over its products' is what this CPU gives the model's own
    mixture of products and memory-bound work (norms, rotary, activations, attention); a prune
    cannot do better than one such pass."""
    import torch

    from bench.flops import ProductCounter

    cal = recipe["calibration"]
    n, size, seq = cal["num_calibration_samples"], cal["batch_size"], cal["max_seq_length"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (n, seq), generator=g)
    body = model.get_decoder()
    with torch.no_grad():  # not inference_mode: the product counter's dispatch mode sees no ops there
        body(ids[:size], use_cache=False)
        t0 = time.perf_counter()
        for i in range(0, n, size):
            body(ids[i : i + size], use_cache=False)
        seconds = time.perf_counter() - t0
        with ProductCounter(shapes=True) as counter:
            for i in range(0, n, size):
                body(ids[i : i + size], use_cache=False)
    product_seconds = 2 * counter.macs / (rate * 1e9)
    own, _ = counter.replayed_seconds()
    return {
        "forward_seconds": seconds,
        "forward_product_seconds": product_seconds,
        "forward_ratio_to_products": seconds / product_seconds,
        "forward_own_product_seconds": own,
        "forward_ratio_to_own_products": seconds / own,
    }


def cmd_time(args: argparse.Namespace) -> None:
    if args.one:
        print("RESULT " + json.dumps(time_one(args)))
        return
    if args.report_only:  # rewrite the page from the last run's JSON (e.g. after a GPU run)
        saved = json.loads(_out_paths(args, "time").with_suffix(".json").read_text())
        for key in ("samples", "seq_len", "ratio", "batch_size", "quick", "activations"):
            setattr(args, key, saved["args"].get(key, getattr(args, key)))
        print(f"wrote {write_time(saved['rows'], args, saved['machine'], saved.get('date', ''))}")
        return
    if args.quick:
        args.samples, args.batch_size = [32], 16
    smollm2_dir(), wikipedia_split()  # prepare the cache outside the timed runs
    mach = machine(args.threads)
    print(f"machine: {_machine_line(mach)}")
    print("| samples | prune s | per-layer s | solves s | peak RSS MB |")
    rows = []
    for n in args.samples:
        row = _child(args, ["--one", str(n), *flags(args, "seq_len", "ratio", "activations", "batch_size")])
        rows.append(row)
        print(
            f"| {n} | {row['prune_seconds']:.1f} | {row['layer_seconds']:.1f} | {row['solve_seconds']:.2f} | "
            f"{row['peak_rss_mb']:.0f} |",
            flush=True,
        )
    print(f"wrote {write_time(rows, args, mach)}")


def _structure(model) -> dict[str, Any]:
    """Query heads and FFN width per layer, and how many layers gather key/value heads by an index
    (their kept query heads no longer form equal groups)."""
    heads, ffn, indexed = [], [], 0
    for layer in model.model.layers:
        attn = layer.self_attn
        kept = getattr(attn, "liar_heads", None)
        heads.append(len(kept) if kept is not None else model.config.num_attention_heads)
        ffn.append(layer.mlp.down_proj.in_features)
        if kept is not None and attn.num_key_value_groups == 1 and len(kept) != len(attn.liar_kv_heads):
            indexed += 1
    return {"heads_per_layer": heads, "ffn_per_layer": ffn, "kv_index_layers": indexed}


def build(spec: str, samples: int) -> tuple[Any, Any, dict[str, Any]]:
    """A model of ``spec`` (in eval mode), its tokenizer and its row: ``0`` (dense),
    ``RATIO:FFN_MULTIPLE:KV_GROUPS[:HEADS_MULTIPLE]`` (magnitude + LIAR, uniform shares, pruned with
    ``samples`` calibration windows), or ``RATIO:default`` (the default recipe at that ratio: criterion
    auto, its allocation, OBS selection, ls, widths rounded for the CPU)."""
    from core.models.loading import load_model
    from core.pipeline.sequential import prune

    ratio, rounding, groups, heads = (spec.split(":") + ["", "", ""])[:4]
    row: dict[str, Any] = {"ratio": float(ratio)}
    if rounding == "default":
        row["default"] = True
    else:
        row.update(round_neurons=int(rounding or 1), kv_groups=groups or "free", round_heads=int(heads or 1))
    if row["ratio"] == 0:
        model, tok, _ = load_model(str(smollm2_dir()), "float32", "cpu")
        row["achieved_ratio"] = 0.0
    else:
        recipe = _recipe(samples, 128, row["ratio"], 16)
        if row.get("default"):
            for key in ("criterion", "reconstruction", "round_to"):  # the defaults instead of the paper's
                recipe.pop(key)
        else:
            recipe["round_to"] = {
                "neurons": row["round_neurons"],
                "kv_groups": row["kv_groups"],
                "heads": row["round_heads"],
            }
        result = prune(recipe)
        model, tok, row["achieved_ratio"] = result.model, result.tokenizer, result.achieved_ratio
    row.update(params=sum(p.numel() for p in model.parameters()), **_structure(model))
    return model.eval(), tok, row


def greedy_steps(model, ids, steps: int) -> tuple[list[float], list[int], float]:
    """``steps`` greedy steps after the prompt ``ids`` (batch 1), one token at a time through the dynamic KV
    cache (the prompt's prefill untimed): each step's seconds, the tokens, and the seconds of them all."""
    out = model(input_ids=ids, use_cache=True)
    cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    tokens, times = [int(nxt)], []
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t)
        tokens.append(int(nxt))
    return times, tokens, time.perf_counter() - t0


def _decode(model, ids, args: argparse.Namespace) -> tuple[dict[str, Any], list[int]]:
    """Batch-1 greedy decode of ``args.new_tokens`` after the prompt ``ids``, one step at a time through the
    cache: its timings, and the tokens of the last repetition (``generate`` must give the same)."""
    steps: list[float] = []
    totals: list[float] = []
    for rep in range(args.warmup + args.repeats):
        per_step, tokens, total = greedy_steps(model, ids, args.new_tokens)
        if rep >= args.warmup:
            totals.append(total)
            steps += per_step
    decode_total = statistics.median(totals)
    steps.sort()
    decode = {
        "prompt": args.decode_prompt,
        "steps": args.new_tokens,
        "tokens_per_s": args.new_tokens / decode_total,
        "ms_per_token_median": 1000 * statistics.median(steps),
        "ms_per_token_p90": 1000 * steps[min(len(steps) - 1, int(0.9 * len(steps)))],
    }
    return decode, tokens


def latency_one(args: argparse.Namespace) -> dict[str, Any]:
    """One model (dense, or pruned in memory at ``--ratio``): prefill, decode and generate timings."""
    import torch

    torch.set_num_threads(args.threads)
    quiet_transformers()
    configure_as_cli()  # the prune as the CLI runs it; the timed forwards are the stock model's
    model, tok, row = build(args.one, args.prune_samples)
    row["prefill"] = []
    _, evaluation = wikipedia_split()
    text = evaluation.read_text()[:400_000]
    stream = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]

    def prompt(batch: int, length: int) -> torch.Tensor:
        return torch.stack([stream[i * length : (i + 1) * length] for i in range(batch)])

    with torch.inference_mode():
        for batch in args.batches:
            for length in args.prompts:
                ids = prompt(batch, length)
                med, times = median_time(
                    lambda ids=ids: model(input_ids=ids, use_cache=True), args.warmup, args.repeats
                )
                row["prefill"].append(
                    {
                        "batch": batch,
                        "prompt": length,
                        "seconds": med,
                        "tokens_per_s": batch * length / med,
                        "all": times,
                    }
                )

        ids = prompt(1, args.decode_prompt)
        row["decode"], tokens = _decode(model, ids, args)

        mask = torch.ones_like(ids)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        gen_kw = dict(
            attention_mask=mask,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        med, _ = median_time(lambda: model.generate(ids, **gen_kw), args.warmup, args.repeats)
        new = model.generate(ids, **gen_kw)[0, ids.shape[1] :].tolist()
        row["generate"] = {
            "new_tokens": args.new_tokens,
            "seconds": med,
            "tokens_per_s": args.new_tokens / med,
            "matches_manual_loop": new == tokens[: len(new)],
        }
    if args.compile:
        row["static_decode"] = _static_decodes(model, stream, args)
    return row


def _static_decodes(model, stream, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Static-cache decoding, eager and compiled, per batch size (``bench/compiled_decode.py``)."""
    from bench.compiled_decode import static_decode

    out = []
    for batch in args.decode_batches:
        n = args.decode_prompt
        ids = stream[: batch * n].reshape(batch, n)
        eager = static_decode(model, ids, args.new_tokens, compiled=False)
        compiled = static_decode(model, ids, args.new_tokens, compiled=True)
        same = "error" not in compiled and compiled.pop("tokens") == eager.pop("tokens")
        out.append({"batch": batch, "eager": eager, "compiled": compiled, "same_tokens": same})
    return out


def cmd_latency(args: argparse.Namespace) -> None:
    if args.one is not None:
        print("RESULT " + json.dumps(latency_one(args)))
        return
    if args.quick:
        args.ratios, args.batches, args.prompts = [0.5], [1], [32]
        args.decode_prompt, args.new_tokens, args.warmup, args.repeats, args.prune_samples = 32, 8, 1, 2, 8
    smollm2_dir(), wikipedia_split()
    mach = machine(args.threads)
    print(f"machine: {_machine_line(mach)}")
    rows = []
    models = args.models or ["0"] + [
        f"{r}:{n}:{g}" for r in args.ratios for n in args.round_neurons for g in args.kv_groups
    ]
    for spec in models:
        row = _child(args, ["--one", spec, *flags(args, *LATENCY_PASSED)])
        rows.append(row)
        prefill = ", ".join(f"b{p['batch']}×{p['prompt']}: {p['tokens_per_s']:,.0f} tok/s" for p in row["prefill"])
        d = row["decode"]
        print(
            f"{_label(row)}: prefill {prefill}; decode {d['tokens_per_s']:.1f} tok/s, "
            f"{d['ms_per_token_median']:.1f} ms/token; generate {row['generate']['tokens_per_s']:.1f} tok/s "
            f"(same tokens: {row['generate']['matches_manual_loop']})",
            flush=True,
        )
    print(f"wrote {write_latency(rows, args, mach)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in (
        ("time", cmd_time, "reconstruction time vs calibration samples"),
        ("latency", cmd_latency, "inference throughput and latency, dense vs pruned"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
        p.add_argument("--quick", action="store_true", help="smoke test: tiny settings, results to a temp folder")
        p.add_argument("--out", help=f"results .md path (a .json is written beside it; default docs/results/{name}.md)")
        p.set_defaults(func=func)
        if name == "time":
            p.add_argument("--samples", type=int, nargs="+", default=list(SAMPLES), help="calibration sample counts")
            p.add_argument("--seq-len", type=int, default=128)
            p.add_argument("--ratio", type=float, default=0.2)
            p.add_argument("--batch-size", type=int, default=16, help="calibration samples per forward pass")
            p.add_argument("--report-only", action="store_true", help="rewrite time.md from time.json, run nothing")
            p.add_argument(
                "--activations",
                default="auto",
                choices=ACTIVATIONS,
                help="the recipe's activations (recompute: the FFN's kept inputs computed again, not kept)",
            )
            p.add_argument(
                "--isa",
                default="default",
                choices=sorted(ISA_ENV),
                help="avx2: run as on a CPU without AVX-512 (results to time_avx2.md unless --out)",
            )
            p.add_argument("--one", type=int, help=argparse.SUPPRESS)
        else:
            p.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.5])
            p.add_argument(
                "--round-neurons",
                type=int,
                nargs="+",
                default=[1, 64],
                help="measure each ratio with kept FFN widths rounded to each of these multiples (1: exact)",
            )
            p.add_argument(
                "--kv-groups",
                nargs="+",
                default=["free"],
                choices=["free", "whole"],
                help="measure each ratio with query heads dropped freely and/or in whole key/value groups",
            )
            p.add_argument("--compile", action="store_true", help="also time static-cache decoding, eager and compiled")
            p.add_argument(
                "--models",
                nargs="+",
                help="explicit models instead of the grid: 0 (dense) or RATIO:FFN_MULTIPLE:KV_GROUPS[:HEADS_MULTIPLE]",
            )
            p.add_argument("--decode-batches", type=int, nargs="+", default=[1], help="static-cache decoding batches")
            p.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="prefill batch sizes")
            p.add_argument("--prompts", type=int, nargs="+", default=[128, 512], help="prefill prompt lengths")
            p.add_argument("--decode-prompt", type=int, default=128, help="prompt length before decoding")
            p.add_argument("--new-tokens", type=int, default=64)
            p.add_argument("--warmup", type=int, default=2)
            p.add_argument("--repeats", type=int, default=7)
            p.add_argument("--prune-samples", type=int, default=32, help="calibration windows for the pruned models")
            p.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
