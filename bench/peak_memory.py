"""Memory a prune holds beyond the model's weights, on a CPU, where a GPU's 7B peak comes from.

A GPU's peak at 7B with 1024 samples (``bench/gpu_liar.py``) is the weights plus what one block's
work keeps: every sample's activations (tokens × hidden size) and the float64 matrices of the FFN's
solve (11,008² channels). Without a GPU this benchmark measures both parts with the engine's own code:

- *runs*: ``core.prune`` of a LLaMA-7B-proportioned model: hidden 1024 and FFN 2752 (7B's widths / 4),
  2 blocks, float32, 128 samples × 128 tokens, so that one hidden-size activation of every sample
  stands to the FFN's Gram as at 7B with 1024 samples in bfloat16 (64 against 58 MiB here, 1.07
  against 0.97 GB there); ratio 0.2, liar, magnitude;
- *solves*: the FFN's LIAR refit alone at LLaMA-7B's widths (11,008 inputs, 80% kept, 4,096
  outputs) on a given float64 Gram, with the statistics kept for the error report (no held-aside
  samples) or released before the solve (held-aside samples).

Each row runs in a fresh process. The peak is that of the bytes held by tensors while the work runs,
beyond those alive before it: torch.profiler's record of every allocation and free of the CPU
allocator, what ``torch.cuda.max_memory_allocated`` counts on a GPU (no weights, interpreter or
allocator slack). It is deterministic: one run per row. One difference: the record does not see the
free of memory allocated before the work, so a refit that releases its statistics before the solve
(the Gram, 924.5 MiB at 7B's FFN) gets no credit for it here, where a GPU's peak would.

    python bench/peak_memory.py --label after --out docs/results/peak_memory.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shapes import LLAMA_SHAPES  # noqa: E402

_7B = LLAMA_SHAPES["7b"]
SHAPE = {  # 7B's widths / 4 (head size 128 kept), 2 blocks
    **_7B,
    "hidden_size": _7B["hidden_size"] // 4,
    "intermediate_size": _7B["intermediate_size"] // 4,
    "num_hidden_layers": 2,
    "num_attention_heads": _7B["num_attention_heads"] // 4,
    "num_key_value_heads": _7B["num_key_value_heads"] // 4,
}
RUNS = [("device", 0), ("recompute", 0), ("device", 8), ("recompute", 8)]  # (activations, held aside)
MIB = 2**20


def peak_mib(fn) -> tuple[float, object]:
    """The peak of the bytes held by tensors while ``fn()`` runs beyond those alive before it, and
    what ``fn`` returned."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0) / MIB, out


def run_child(activations: str, holdout: int, samples: int = 128) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from core import prune
    from core.data.calibration import CalibrationBatch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, max_position_embeddings=512)).eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (samples + holdout, 128), generator=gen)
    fit = CalibrationBatch(ids[:samples], torch.ones_like(ids[:samples]))
    held = CalibrationBatch(ids[samples:], torch.ones_like(ids[samples:]))
    recipe = {
        "model": "random-llama-7b-proportioned",
        "ratio": 0.2,
        "device": "cpu",
        "dtype": "float32",
        "criterion": {"name": "magnitude"},
        "reconstruction": {"method": "liar", "select": "criterion"},
        "activations": activations,
        "calibration": {
            "texts": ["(pre-tokenised)"],
            "num_calibration_samples": samples,
            "max_seq_length": 128,
            "holdout_samples": holdout,
            "batch_size": 16,
        },
    }
    peak, result = peak_mib(lambda: prune(recipe, model=model, calibration=(fit, held)))
    return {
        "part": "run",
        "setting": f"activations {result.metrics['activations']}, {holdout} held aside",
        "peak_mib": round(peak, 1),
        "activations_mib": round((samples + holdout) * 128 * SHAPE["hidden_size"] * 4 / MIB, 1),
        "gram_mib": round(SHAPE["intermediate_size"] ** 2 * 8 / MIB, 1),
    }


def solve_child(release: bool, channels: int = 11008, outputs: int = 4096) -> dict:
    import torch

    from core.stats.accumulate import InputStats
    from core.stats.reconstruct import reconstruct_from_stats

    gen = torch.Generator().manual_seed(0)
    g = torch.randn(channels, channels, dtype=torch.float64, generator=gen).mul_(0.01)
    g.add_(g.T.clone()).diagonal().add_(float(channels))  # diagonally dominant: positive definite
    stats = InputStats(channels, torch.float64)
    stats._gram, stats.count = g, 10 * channels  # a Gram as the statistics would hold it
    del g
    weight = torch.randn(outputs, channels, generator=gen).mul_(0.02).to(torch.bfloat16)
    keep = torch.rand(channels, generator=gen) < 0.8
    peak, _ = peak_mib(lambda: reconstruct_from_stats("liar", weight, None, keep, stats, 1e-3, release=release))
    return {
        "part": "solve",
        "setting": f"statistics {'released' if release else 'kept'}, {int(keep.sum())} of {channels} kept",
        "peak_mib": round(peak, 1),
        "activations_mib": None,
        "gram_mib": round(channels**2 * 8 / MIB, 1),
    }


def _cell(value) -> str:
    return "–" if value is None else str(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="now", help="names this code's rows (e.g. before / after a change)")
    p.add_argument("--out", help="append the rows to OUT's .json and rewrite OUT as a table")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        part, a, b = args.child
        row = run_child(a, int(b)) if part == "run" else solve_child(a == "released")
        print(json.dumps(row))
        return
    jobs = [("run", a, str(h)) for a, h in RUNS] + [("solve", r, "-") for r in ("kept", "released")]
    rows = []
    for job in jobs:
        cmd = [sys.executable, __file__, "--child", *job]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row.update(label=args.label, date=dt.date.today().isoformat())
        print(json.dumps(row), flush=True)
        rows.append(row)
    if not args.out:
        return
    out = Path(args.out)
    store = out.with_suffix(".json")
    previous = json.loads(store.read_text()) if store.is_file() else []
    rows = [r for r in previous if r["label"] != args.label] + rows
    store.write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Memory a prune holds beyond the weights (CPU, the parts of a GPU's 7B peak)",
        "",
        "`python bench/peak_memory.py` (see its docstring): the peak of the bytes held by tensors during the "
        "work beyond those alive before it, in MiB. *run*: `core.prune` of a LLaMA-7B-proportioned model "
        f"(hidden {SHAPE['hidden_size']}, FFN {SHAPE['intermediate_size']}, 2 blocks, float32, 128 × 128 tokens); "
        "*solve*: the FFN's LIAR refit alone at LLaMA-7B's widths. *activations*: one hidden-size activation of "
        "every sample; *Gram*: the FFN's float64 input Gram (alive before the work; a refit that releases it "
        "before its solve gets no credit for that here, see the docstring).",
        "",
        "| code | part | setting | peak MiB | activations MiB | Gram MiB | date |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["part"], r["setting"], r["label"])):
        lines.append(
            f"| {r['label']} | {r['part']} | {r['setting']} | {r['peak_mib']} | {_cell(r['activations_mib'])} | "
            f"{r['gram_mib']} | {r['date']} |"
        )
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
