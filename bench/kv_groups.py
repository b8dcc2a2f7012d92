"""Whole key/value groups vs free query heads on SmolLM2-135M: held-out perplexity of the default recipe.

The default recipe (magnitude counts, uniform allocation, OBS selection + ``ls``, ``round_to.neurons:
auto`` = 64 on this CPU) at 20% and 50%, with ``round_to.kv_groups`` free (query heads go one at a time;
uneven groups gather key/value heads by index) and whole (query heads go only as whole groups, every
layer a stock GQA attention). Calibration and evaluation as in ``docs/results/criteria.md``: 128 × 128
calibration tokens from 70% of the Wikipedia articles, perplexity on 20 windows of 512 tokens of the
other 30%. Each cell runs in its own process, one at a time; finished cells are kept (resumable).
The speed of the same models: ``python bench/speed.py latency --kv-groups free whole``.

    python bench/kv_groups.py [--ratios 0.2 0.5] [--groups free whole] [--threads 2]
    python bench/kv_groups.py --ratios 0.5 --groups whole --round-heads 6   # keep 2 of SmolLM2's 3 groups
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import smollm2_dir, wikipedia_split  # noqa: E402
from bench.common import cell_parser, cpu_line, flags, heldout, run_cells, span, today, write_page  # noqa: E402

OUT = ROOT / "docs" / "results" / "kv_groups.md"


def default_recipe(ratio: float, groups: str, heads: int = 1) -> dict:
    """The default recipe on SmolLM2 (every field not named here is the recipe's default); ``heads``:
    kept query heads a multiple of it (``round_to.heads``)."""
    calib, _ = wikipedia_split()
    return {
        "model": str(smollm2_dir()),
        "ratio": ratio,
        "round_to": {"kv_groups": groups, "heads": heads},
        # the uniform recipe these pages measure (criterion auto picks obs + global up to 30% since;
        # bench/obs_allocation.py measures that)
        "criterion": {"name": "magnitude"},
        "allocation": "uniform",
        # heads at the layer's ratio, as this table was measured (the default became head_ratio: auto
        # afterwards; bench/head_ratio.py measures that split and overrides this)
        "head_ratio": "same",
        "dtype": "float32",
        "device": "cpu",
        "calibration": {
            "dataset": str(calib),
            "num_calibration_samples": 128,
            "max_seq_length": 128,
            "holdout_samples": 8,
            "seed": 0,
            "batch_size": 16,
        },
    }


def one(args) -> dict:
    """One cell, in a child process: prune (or load the dense model) and evaluate."""
    import torch

    from core import prune
    from core.models.loading import load_model

    torch.set_num_threads(args.threads)
    if args.cell_groups == "dense":
        model, tok, _ = load_model(str(smollm2_dir()), "float32", "cpu")
        row = {"groups": "dense", "ratio": 0.0}
    else:
        result = prune(default_recipe(args.ratio, args.cell_groups, args.round_heads))
        model, tok, s = result.model, result.tokenizer, result.summary()
        row = {
            "groups": args.cell_groups,
            "ratio": args.ratio,
            "round_heads": args.round_heads,
            "achieved_ratio": result.achieved_ratio,
            "prune_seconds": result.seconds,
            "heads": sorted({len(lp.heads) for lp in result.plan.layers}),
            "kv_heads": sorted({len(lp.kv_heads) for lp in result.plan.layers}),
            "ffn": sorted({len(lp.neurons) for lp in result.plan.layers}),
            "kv_index_layers": s["kv_index_layers"],
            "round_to_neurons": s["round_to_neurons"],
        }
    ppl = heldout(model, tok, args.eval_windows)
    row.update(perplexity=ppl["perplexity"], eval_tokens=ppl["tokens"])
    return row


def _key(groups: str, ratio: float, heads: int = 1) -> str:
    return "dense" if groups == "dense" else f"{groups}@{ratio}" + (f"/heads×{heads}" if heads > 1 else "")


def write(rows: dict[str, dict], args) -> None:
    machine = cpu_line(args.threads)
    dense = rows.get("dense", {}).get("perplexity")
    lines = [
        "# Whole key/value groups vs free query heads: quality (SmolLM2-135M)",
        "",
        f"Measured {today()} on {machine}. Produced by `python bench/kv_groups.py`.",
        "",
        "The default recipe (magnitude counts, uniform allocation, OBS selection + `ls`, FFN widths `auto` = ×64",
        "on a CPU), `round_to.kv_groups` free or whole; 128 × 128 calibration tokens, perplexity on",
        f"{args.eval_windows} held-out windows of 512 tokens" + (f"; dense perplexity {dense:.2f}." if dense else "."),
        "",
        "| round_to | target | removed | query heads / kv heads per layer | FFN width | layers gathering k/v "
        "| perplexity |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = sorted(
        (r for r in rows.values() if r["groups"] != "dense"), key=lambda r: (r["ratio"], r.get("round_heads", 1))
    )
    for r in cells:
        heads = r.get("round_heads", 1)
        label = f"kv_groups: {r['groups']}" + (f", heads: {heads}" if heads > 1 else "")
        lines.append(
            f"| {label} | {r['ratio']:.0%} | {r['achieved_ratio']:.2%} | {span(r['heads'])} / {span(r['kv_heads'])} "
            f"| {span(r['ffn'])} | {r['kv_index_layers']} of 30 | {r['perplexity']:.2f} |"
        )
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = cell_parser(__doc__)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.2, 0.5])
    p.add_argument("--groups", nargs="+", default=["free", "whole"], choices=["free", "whole"])
    p.add_argument("--eval-windows", type=int, default=20, help="512-token windows of held-out text")
    p.add_argument("--round-heads", type=int, default=1, help="round_to.heads of the pruned cells")
    p.add_argument("--cell", dest="cell_groups", default="dense", help=argparse.SUPPRESS)
    args = p.parse_args()
    common = flags(args, "round_heads", "threads", "eval_windows")
    cells = [
        (_key(g, r, args.round_heads), ["--cell", g, "--ratio", str(r), *common])
        for g, r in [("dense", 0.0)] + [(g, r) for r in args.ratios for g in args.groups]
    ]
    key = lambda r: _key(r["groups"], r["ratio"], r.get("round_heads", 1))  # noqa: E731
    run_cells(__file__, args, one, OUT, key, cells, write, lambda row: [row["perplexity"]])


if __name__ == "__main__":
    main()
