"""LIAR reconstruction time on a LLaMA-7B/13B-shaped random-init model in bf16 (GPU timing benchmark).

Random weights and random token ids are fine for timing: the work (statistics, Cholesky solves,
surgery, block passes) does not depend on the values. Times `core.prune` with the model already on
the device, for 128 and 1024 calibration samples × 128 tokens, and writes docs/results/gpu_liar.md
beside the paper's A100 minutes (LLaMA-7B: 1.0 min at 128 samples, 3.9 min at 1024).

    python bench/gpu_liar.py                      # on a CUDA machine (H100/H200)
    python bench/gpu_liar.py --shape small --device cpu --samples 8 16   # smoke test anywhere
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.random_llama import random_calibration  # noqa: E402
from bench.shapes import LLAMA_SHAPES  # noqa: E402
from core import prune  # noqa: E402
from core.spec.recipe import ACTIVATIONS  # noqa: E402

SHAPES = {k: LLAMA_SHAPES[k] for k in ("7b", "13b", "30b", "small")}
PAPER_MINUTES = {  # the paper's A100 times (its time-consumption table)
    ("7b", 128): 1.0,
    ("7b", 1024): 3.9,
    ("13b", 128): 3.1,
    ("13b", 1024): 7.9,
    ("30b", 128): 6.6,
    ("30b", 1024): 19.7,
}


def build(shape: str, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(dtype)  # allocated in ``dtype``: a 30B model in float32 fits no GPU
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model.model.rotary_emb = LlamaRotaryEmbedding(cfg).to(device)  # its buffers are lost by meta init
    return model.eval()


def _profile(args, recipe, fit, held, dtype) -> None:
    """Prune a fresh model under torch.profiler; write the operators by device time."""
    from torch.profiler import ProfilerActivity, profile

    model = build(args.shape, args.device, dtype)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        prune(recipe, model=model, calibration=(fit, held))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    Path(args.profile).write_text(prof.key_averages().table(sort_by=key, row_limit=30))
    print(f"wrote {args.profile}")
    del model


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    p.add_argument("--samples", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--method", default="liar")
    p.add_argument(
        "--criterion",
        default="magnitude",
        help="magnitude (the paper's timing, this table's rows) or auto (today's default: obs counts, global)",
    )
    p.add_argument(
        "--select",
        default="criterion",
        choices=["criterion", "obs", "auto"],
        help="which units go: the criterion's ranking (the paper's work, the default) or the OBS selection",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu_liar.md"))
    p.add_argument("--profile", help="also profile the last run with torch.profiler and write the table here")
    p.add_argument("--stats-dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--holdout", type=int, default=0, help="held-aside samples for the error report (recipe default: 8)")
    p.add_argument(
        "--activations",
        default="auto",
        choices=ACTIVATIONS,
        help="the recipe's activations: recompute keeps them on the device but computes the FFN's kept inputs "
        "again instead of keeping them; host keeps them in pinned host memory",
    )
    return p


def main() -> None:
    args = _parser().parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for n in args.samples:
        model = build(args.shape, args.device, dtype)
        fit, held = random_calibration(model.config.vocab_size, n, args.seq_len, args.holdout)
        recipe = {
            "model": f"random-llama-{args.shape}",
            "ratio": args.ratio,
            "dtype": args.dtype,
            "device": args.device,
            "criterion": {"name": args.criterion},
            "reconstruction": {"method": args.method, "select": args.select},
            "stats_dtype": args.stats_dtype,
            "activations": args.activations,
            "calibration": {
                "texts": ["(pre-tokenised)"],
                "num_calibration_samples": n,
                "max_seq_length": args.seq_len,
                "holdout_samples": args.holdout,
                "batch_size": 16,
            },
        }
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        t0 = time.perf_counter()
        result = prune(recipe, model=model, calibration=(fit, held))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if args.profile and n == args.samples[-1]:
            _profile(args, recipe, fit, held, dtype)
        paper = PAPER_MINUTES.get((args.shape, n))
        row = {
            "samples": n,
            "seconds": seconds,
            "peak_memory_mb": result.peak_memory_mb,  # MiB (torch.cuda.max_memory_allocated / 2**20)
            "peak_gb": result.peak_memory_mb * 2**20 / 1e9,
            "weights_gb": weight_bytes / 1e9,
            "achieved_ratio": result.achieved_ratio,
            "activations": result.metrics["activations"],
            "criterion": result.metrics["criterion"],
            "paper_a100_minutes": paper,
            "speedup_vs_paper": (paper * 60 / seconds) if paper else None,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model, result
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    lines = [
        f"# LIAR reconstruction time: LLaMA-{args.shape.upper()}-shaped random model, {args.dtype}",
        "",
        f"Measured {dt.date.today().isoformat()} on {device_name}, torch {torch.__version__}; "
        f"`python bench/gpu_liar.py --shape {args.shape}`. Peak device memory in GB (10⁹ bytes), also as a "
        f"multiple of the model's weights. Ratio {args.ratio} (heads + neurons, {args.criterion}), "
        f"{args.seq_len}-token samples, method `{args.method}`; time of `core.prune` with the model on the device.",
        "",
        "| samples | activations | seconds | peak GB | × weights | paper (A100) | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = f"{r['paper_a100_minutes']} min" if r["paper_a100_minutes"] else "–"
        speed = f"{r['speedup_vs_paper']:.1f}×" if r["speedup_vs_paper"] else "–"
        lines.append(
            f"| {r['samples']} | {r['activations']} | {r['seconds']:.1f} | {r['peak_gb']:.1f} | "
            f"{r['peak_gb'] / r['weights_gb']:.2f} × | {paper} | {speed} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
