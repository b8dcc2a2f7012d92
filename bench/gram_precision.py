"""Precision of the Gram products against a float64 reference, on the activations of a real model.

The statistics multiply each batch of inputs in float32 (``stats_dtype: float32``, the default) and add
the result to float64 totals; on a GPU, bfloat16 / float16 inputs are multiplied on tensor cores with a
float32 result (see ``core/stats/accumulate.py``). This script measures what that costs against
accumulating the same inputs in float64 throughout (``stats_dtype: float64``), per pruned projection
(o_proj, down_proj) of the first layers, and what it changes in LIAR's solution:

- ``gram``: ‖G − G64‖_F / ‖G64‖_F, the relative error of the accumulated Gram matrix;
- ``liar``: ‖W' − W'64‖_F / ‖W'64‖_F of the reconstructed weight at ratio 0.2 (magnitude keep-set).

    python bench/gram_precision.py                       # SmolLM2-135M activations (CPU, bf16 inputs)
    python bench/gram_precision.py --device cuda          # the same on a GPU (tensor-core products)
    python bench/gram_precision.py --random-shape 7b --device cuda   # LLaMA-7B-shaped random weights
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.data.calibration import CalibrationBatch  # noqa: E402
from core.kernels import cpu_matmul  # noqa: E402
from core.stats.accumulate import InputStats  # noqa: E402
from core.stats.reconstruct import reconstruct_from_stats  # noqa: E402


def _inputs(model, n_layers: int, ids: torch.Tensor, batch: int) -> dict[str, list[torch.Tensor]]:
    """Inputs of o_proj and down_proj of the first ``n_layers`` layers, per batch (model dtype)."""
    captured: dict[str, list[torch.Tensor]] = {}
    handles = []
    for li, layer in enumerate(model.model.layers[:n_layers]):
        for name, mod in (("o_proj", layer.self_attn.o_proj), ("down_proj", layer.mlp.down_proj)):
            key = f"{li}.{name}"
            captured[key] = []
            handles.append(mod.register_forward_pre_hook(lambda _m, a, key=key: captured[key].append(a[0].detach())))
    with torch.no_grad():
        for lo in range(0, len(ids), batch):
            b = CalibrationBatch(ids[lo : lo + batch], torch.ones_like(ids[lo : lo + batch]))
            model.model(**b.model_inputs("decoder", ids.device))
    for h in handles:
        h.remove()
    return captured


def _row(key: str, weight: torch.Tensor, batches: list[torch.Tensor]) -> dict:
    stats = {}
    for dtype in (torch.float32, torch.float64):
        s = InputStats(weight.shape[1], dtype, batches[0].device)
        for x in batches:
            s.add_batch(x)
        stats[dtype] = s
    g32, g64 = stats[torch.float32].gram, stats[torch.float64].gram
    keep = torch.ones(weight.shape[1], dtype=torch.bool, device=weight.device)
    keep[weight.float().pow(2).sum(0).argsort()[: weight.shape[1] // 5]] = False
    w32, _ = reconstruct_from_stats("liar", weight, None, keep, stats[torch.float32], 1e-3)
    w64, _ = reconstruct_from_stats("liar", weight, None, keep, stats[torch.float64], 1e-3)
    return {
        "projection": key,
        "tokens": stats[torch.float64].count,
        "gram_rel_error": float((g32 - g64).norm() / g64.norm()),
        "liar_weight_rel_error": float((w32 - w64).norm() / w64.norm()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--random-shape", choices=["7b"], help="a random-weight LLaMA shape instead of SmolLM2")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "gram_precision.md"))
    args = p.parse_args()
    cpu_matmul.configure()  # as the liar CLI does: LIAR_CPU_MATMUL, default auto
    dtype = getattr(torch, args.dtype)
    if args.random_shape:
        from bench.gpu_liar import build

        model, source = build(args.random_shape, args.device, dtype), f"LLaMA-{args.random_shape}-shaped random weights"
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (args.samples, args.seq_len), generator=gen)
    else:
        from bench.assets import smollm2_dir, wikipedia_split
        from core.data.calibration import decoder_windows
        from core.data.texts import read_records
        from core.models.loading import load_model
        from core.spec.recipe import CalibrationConfig

        model, tok, _ = load_model(str(smollm2_dir()), args.dtype, args.device)
        calib, _ = wikipedia_split()
        cfg = CalibrationConfig(dataset=str(calib), num_calibration_samples=args.samples, max_seq_length=args.seq_len)
        ids = decoder_windows(read_records(calib, "text"), tok, cfg)[0].input_ids
        source = "SmolLM2-135M-Instruct on Wikipedia calibration windows"
    ids = ids.to(args.device)
    captured = _inputs(model, args.layers, ids, 16)
    rows = []
    for key, batches in captured.items():
        li, name = key.split(".")
        layer = model.model.layers[int(li)]
        weight = (layer.self_attn.o_proj if name == "o_proj" else layer.mlp.down_proj).weight.detach()
        rows.append(_row(key, weight, batches))
        print(json.dumps(rows[-1]), flush=True)
    if args.device.startswith("cuda"):
        device = torch.cuda.get_device_name()
    else:  # which library multiplied the float32 products (core/kernels/cpu_matmul.py)
        device = f"CPU (float32 products through {'oneDNN' if cpu_matmul.backend() == 'onednn' else 'the BLAS'})"
    lines = [
        "# Gram precision: float32 products (tensor cores for half inputs on a GPU) vs float64",
        "",
        f"Measured {dt.date.today().isoformat()} on {device}, torch {torch.__version__}: {source}, "
        f"{args.dtype} activations, {args.samples} × {args.seq_len} tokens; `python bench/gram_precision.py "
        f"--device {args.device}{' --random-shape ' + args.random_shape if args.random_shape else ''}`. "
        "What the numbers mean: `gram_precision-notes.md`.",
        "",
        "| projection | tokens | ‖G − G64‖ / ‖G64‖ | ‖W' − W'64‖ / ‖W'64‖ (LIAR, 20%) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['projection']} | {r['tokens']} | {r['gram_rel_error']:.2e} | {r['liar_weight_rel_error']:.2e} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
