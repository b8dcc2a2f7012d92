"""How a uniform layer should split its share between query heads and FFN neurons (``head_ratio``).

The default recipe on SmolLM2-135M (magnitude counts, uniform allocation, OBS selection + ``ls``,
FFN widths ``auto`` = ×64 on a CPU, free key/value groups) at 20%, 30% and 50% with every number of
kept query heads per layer (``head_ratio`` = removed heads / 9; the neurons make up the rest of each
layer's share, so every cell removes the same parameters), and the two named splits: ``same`` (heads
at the layer's ratio, the paper's uniform split) and ``auto`` (half of it, the default). Calibration
and evaluation as in ``docs/results/criteria.md``: 128 × 128 calibration tokens from 70% of the
Wikipedia articles, perplexity on 20 windows of 512 tokens of the other 30%. Each cell runs in its own
process, one at a time; finished cells are kept (resumable).

    python bench/head_ratio.py [--ratios 0.2 0.3 0.5] [--keep 5 6 7 8 9] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cell_parser, cpu_line, heldout, run_cells, span, today, write_page  # noqa: E402
from bench.kv_groups import default_recipe  # noqa: E402

OUT = ROOT / "docs" / "results" / "head_ratio.md"
N_HEADS = 9  # SmolLM2-135M's query heads per layer


def _split(value: str) -> float | str:
    return value if value in ("same", "auto", "obs") else float(value)


def one(args) -> dict:
    """One cell, in a child process: prune with the given split and evaluate."""
    import torch

    from core import prune

    torch.set_num_threads(args.threads)
    recipe = default_recipe(args.ratio, "free") | {"head_ratio": _split(args.split)}
    result = prune(recipe)
    row = {
        "ratio": args.ratio,
        "head_ratio": _split(args.split),
        "achieved_ratio": result.achieved_ratio,
        "prune_seconds": result.seconds,
        "heads": sorted({len(lp.heads) for lp in result.plan.layers}),
        "kv_heads": sorted({len(lp.kv_heads) for lp in result.plan.layers}),
        "ffn": sorted({len(lp.neurons) for lp in result.plan.layers}),
    }
    ppl = heldout(result.model, result.tokenizer)
    return row | {"perplexity": ppl["perplexity"], "eval_tokens": ppl["tokens"]}


def _label(split: float | str) -> str:
    named = {"same": "same (the paper's split)", "auto": "**auto (the default)**", "obs": "obs (each layer's own)"}
    return named[split] if isinstance(split, str) else f"{split:.3f}"


def write(rows: dict[str, dict], args) -> None:
    machine = cpu_line(args.threads)
    lines = [
        "# Splitting a layer's share between heads and neurons (`head_ratio`, SmolLM2-135M)",
        "",
        f"Measured {today()} on {machine}. Produced by `python bench/head_ratio.py`.",
        "",
        "The default recipe (magnitude counts, uniform allocation, OBS selection + `ls`, FFN widths ×64, free",
        "key/value groups); every row of a ratio removes the same parameters, only the split differs:",
        "`head_ratio` is the fraction of each layer's 9 query heads removed, the FFN neurons make up the rest.",
        "128 × 128 calibration tokens, perplexity on 20 held-out windows of 512 tokens (dense 20.81).",
        "",
        "| target | head_ratio | removed | query / kv heads per layer | FFN width | perplexity |",
        "|---|---|---|---|---|---|",
    ]
    named = {"same": -3, "auto": -2, "obs": -1}
    order = lambda r: (r["ratio"], named.get(r["head_ratio"], r["head_ratio"]))  # noqa: E731
    for r in sorted(rows.values(), key=order):
        lines.append(
            f"| {r['ratio']:.0%} | {_label(r['head_ratio'])} | {r['achieved_ratio']:.2%} | "
            f"{span(r['heads'])} / {span(r['kv_heads'])} | {span(r['ffn'])} | {r['perplexity']:.2f} |"
        )
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = cell_parser(__doc__)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.2, 0.3, 0.5])
    p.add_argument("--keep", nargs="+", type=int, default=[5, 6, 7, 8, 9], help="kept query heads per layer")
    p.add_argument("--split", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    cells = []
    for ratio in args.ratios:
        named = {round(ratio * N_HEADS), round(ratio / 2 * N_HEADS)}  # heads removed by same and auto
        splits = ["same", "auto", "obs"] + [
            round((N_HEADS - k) / N_HEADS, 6) for k in args.keep if N_HEADS - k not in named
        ]
        threads = ["--threads", str(args.threads)]
        cells += [(f"{ratio}|{x}", ["--ratio", str(ratio), "--split", str(x), *threads]) for x in splits]
    key = lambda r: f"{r['ratio']}|{r['head_ratio']}"  # noqa: E731
    run_cells(__file__, args, one, OUT, key, cells, write, lambda row: [row["heads"], round(row["perplexity"], 2)])


if __name__ == "__main__":
    main()
