"""Realised speed of uniformly pruned LLaMA-7B-shaped models on a GPU: prefill and decode, eager and compiled.

A uniformly pruned model is a stock LLaMA with fewer heads and a narrower FFN, so its speed does not
depend on the weights: this builds random bfloat16 models of the widths that uniform pruning of
heads and neurons leaves (dense; 20/30/50% removed with exact widths and with FFN widths rounded to
128, the GPU default of ``round_to.neurons: auto``) and measures

- prefill tokens/s: one forward over batch × prompt tokens (batch 8 × 512 and batch 1 × 512);
- decode ms/token, batch 1, 64 new tokens after a 128-token prompt: ``model.generate`` eager (dynamic
  KV cache) and compiled (static KV cache + ``torch.compile(mode="reduce-overhead")``, CUDA graphs).

Median of repeats after warm-up, CUDA events. Writes docs/results/gpu_latency.md (+ .json).

    python bench/gpu_latency.py [--ratios 0.2 0.5] [--no-compile] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, FFN, HEADS, LAYERS, VOCAB = 4096, 11008, 32, 32, 32000


def widths(ratio: float, multiple: int) -> tuple[int, int]:
    """Kept heads and FFN width after removing ``ratio`` of each (uniform pruning of both modules)."""
    heads = max(1, round(HEADS * (1 - ratio)))
    neurons = round(FFN * (1 - ratio))
    if multiple > 1:
        neurons = max(multiple, round(neurons / multiple) * multiple)
    return heads, neurons


def build(heads: int, neurons: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=neurons,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HIDDEN // HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
    )
    # transformers refuses a stock config whose head count does not divide the hidden size (26 of
    # 4096): set the pruned count after validation, as a liar_ checkpoint's layers end up
    cfg.num_attention_heads = cfg.num_key_value_heads = heads
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def _time(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


@torch.no_grad()
def measure(model, compile_decode: bool) -> dict:
    out = {"params": sum(p.numel() for p in model.parameters())}
    for batch, length in ((8, 512), (1, 512)):
        ids = torch.randint(0, VOCAB, (batch, length), device="cuda")
        out[f"prefill_b{batch}x{length}_tok_s"] = batch * length / _time(lambda ids=ids: model(ids, use_cache=False))
    prompt = torch.randint(0, VOCAB, (1, 128), device="cuda")
    new = 64

    def gen():
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    out["decode_eager_ms"] = 1000 * _time(gen, repeats=3, warmup=1) / new
    if compile_decode:
        try:  # generate() compiles the forward itself once the KV cache is static (CompileConfig)
            model.generation_config.cache_implementation = "static"
            out["decode_compiled_ms"] = 1000 * _time(gen, repeats=3, warmup=3) / new
        except Exception as exc:  # record why, keep the eager numbers
            out["decode_compiled_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return out


def _cell(row: dict, dense: dict, key: str, higher_better: bool = True) -> str:
    if key not in row or key not in dense:
        return "–"
    if higher_better:
        return f"{row[key]:,.0f} ({row[key] / dense[key]:.2f}×)"
    return f"{row[key]:.2f} ({dense[key] / row[key]:.2f}×)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    p.add_argument("--multiple", type=int, default=128)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu_latency.md"))
    args = p.parse_args()
    rows = []
    configs = [("dense", 0.0, 1)] + [
        (f"{int(r * 100)}% {tag}", r, m)
        for r in args.ratios
        for tag, m in (("exact", 1), (f"÷{args.multiple}", args.multiple))
    ]
    seen = set()
    for label, ratio, multiple in configs:
        heads, neurons = (HEADS, FFN) if ratio == 0 else widths(ratio, multiple)
        if (heads, neurons) in seen:  # rounding changed nothing (e.g. 50%: 5504 = 43 × 128)
            continue
        seen.add((heads, neurons))
        model = build(heads, neurons)
        row = {"model": label, "heads": heads, "ffn": neurons, **measure(model, not args.no_compile)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    dense = rows[0]
    lines = [
        "# Realised speed of uniformly pruned LLaMA-7B-shaped models (bfloat16)",
        "",
        f"Measured {dt.date.today().isoformat()} on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
        "`python bench/gpu_latency.py`. Speed-ups against the dense model in brackets.",
        "",
        "| model | heads | FFN | params (B) | prefill 8×512 tok/s | prefill 1×512 tok/s "
        "| decode eager ms/tok | decode compiled ms/tok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['heads']} | {r['ffn']} | {r['params'] / 1e9:.2f} | "
            f"{_cell(r, dense, 'prefill_b8x512_tok_s')} | {_cell(r, dense, 'prefill_b1x512_tok_s')} | "
            f"{_cell(r, dense, 'decode_eager_ms', False)} | {_cell(r, dense, 'decode_compiled_ms', False)} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
