"""A gradient-free non-uniform allocation from OBS error curves: ``criterion: obs`` with ``allocation: global``.

The default recipe spends the budget uniformly: every layer loses the same share. Here each layer's
share comes from how much output error its units leave behind once the rest is refitted: on the
*dense* model, the greedy OBS paths of o_proj (heads) and of the FFN's down projection (neurons)
give the error after each removal; each unit's marginal error (non-decreasing along its path),
divided by the mean squared norm of the residual stream entering the block (``--norm resid``) or
not (``--norm none``), is its score, and ``allocation: global`` ranks all units of all layers by score
per parameter removed (``core/criteria/obs.py``). ``--cap`` sets ``max_layer_ratio`` to ``cap × ratio``.
Everything else is the default recipe (OBS selection + ``ls``; FFN widths ×64).

Calibration and evaluation as in ``docs/results/unseen.md``: 128 × 128 tokens of the Wikipedia
calibration articles; perplexity on 20 windows of 512 tokens of the Wikipedia evaluation split and of
the Rotten Tomatoes test snippets. Each cell runs in its own process; finished cells are kept.

    python bench/obs_allocation.py [--ratios 0.2 0.5] [--caps 0 1.5] [--norm resid]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kv_groups import cell_parser, run_missing, saved_rows, span, write_page  # noqa: E402

OUT = ROOT / "docs" / "results" / "obs_allocation.md"
STEP = 32  # neurons per round of the FFN's path (the criterion's default)


def one(args) -> dict:
    import torch

    from bench.unseen import both_texts
    from bench.unseen import recipe as bench_recipe
    from core import prune

    torch.set_num_threads(args.threads)
    options = {"normalize": "residual" if args.norm == "resid" else "none", "step": STEP}
    if args.cap:
        options["max_layer_ratio"] = min(1.0, args.cap * args.ratio)
    recipe = bench_recipe("auto", args.ratio) | {
        "allocation": "global",
        "criterion": {"name": "obs", "options": options},
    }
    result = prune(recipe)
    row = {
        "ratio": args.ratio,
        "cap": args.cap,
        "norm": args.norm,
        "achieved_ratio": result.achieved_ratio,
        "prune_seconds": round(result.seconds, 1),
        "layers": [[len(lp.heads), len(lp.neurons)] for lp in result.plan.layers],
    }
    return row | both_texts(result.model, result.tokenizer)


# the same recipes' references, from unseen.md (same calibration, evaluation and day's engine)
REFERENCE = {  # ratio: (paper-exact FLAP + LIAR, the default) on (Wikipedia, Rotten Tomatoes)
    0.2: ((44.09, 163.09), (40.24, 143.41)),
    0.3: ((None, None), (54.33, None)),  # the default's Wikipedia cell from head_ratio.md; no others measured
    0.5: ((156.52, 498.72), (113.21, 407.04)),
}


def write(rows: dict[str, dict], args) -> None:
    import datetime as dt

    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} torch threads"
    lines = [
        "# Non-uniform allocation from OBS error curves: `criterion: obs` (SmolLM2-135M)",
        "",
        f"Measured {dt.date.today().isoformat()} on {machine}. Produced by `python bench/obs_allocation.py`.",
        "",
        "`criterion: obs` with `allocation: global` (per-layer counts from the dense model's OBS error",
        "curves), then the default pipeline. × paper / × default: against paper-exact FLAP + LIAR and the",
        "default recipe (uniform shares, `head_ratio: auto`) at the same target (`unseen.md`).",
        "",
        "| target | cap | norm | removed | query heads per layer | FFN width | Wikipedia | × paper | × default "
        "| Rotten Tomatoes | × paper | × default |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows.values(), key=lambda r: (r["ratio"], r["cap"] or 99, r["norm"])):
        (pw, pr), (dw, dr) = REFERENCE.get(r["ratio"], ((None, None), (None, None)))
        heads = sorted({h for h, _ in r["layers"]})
        widths = sorted({n for _, n in r["layers"]})

        def rel(x, ref):
            return f"{x / ref:.2f}" if ref else "–"

        cap = f"{r['cap']:g} × ratio" if r["cap"] else "none"
        lines.append(
            f"| {r['ratio']:.0%} | {cap} | {r['norm']} "
            f"| {r['achieved_ratio']:.2%} | {span(heads)} | {span(widths)} "
            f"| {r['wikipedia']:.2f} | {rel(r['wikipedia'], pw)} | {rel(r['wikipedia'], dw)} "
            f"| {r['rotten_tomatoes']:.2f} | {rel(r['rotten_tomatoes'], pr)} | {rel(r['rotten_tomatoes'], dr)} |"
        )
    lines += ["", "Kept (heads, FFN width) per layer:", ""]
    for r in sorted(rows.values(), key=lambda r: (r["ratio"], r["cap"] or 99, r["norm"])):
        lines.append(
            f"- {r['ratio']:.0%}, cap {r['cap'] or 'none'}, {r['norm']}: "
            + " ".join(f"{h}/{n}" for h, n in r["layers"])
        )
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = cell_parser(__doc__)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.2, 0.5])
    p.add_argument("--caps", nargs="+", type=float, default=[0.0, 1.5], help="0: no cap")
    p.add_argument("--norm", choices=["resid", "none"], default="resid")
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return
    rows = saved_rows(OUT, lambda r: f"{r['ratio']}|{r['cap']}|{r['norm']}")
    todo = [] if args.report_only else [(r, c) for r in args.ratios for c in args.caps]
    flags = ["--norm", args.norm, "--threads", str(args.threads)]
    cells = [(f"{r}|{c}|{args.norm}", ["--ratio", str(r), "--cap", str(c), *flags]) for r, c in todo]

    def done(key: str, row: dict) -> None:
        print(key, round(row["wikipedia"], 2), round(row["rotten_tomatoes"], 2), flush=True)
        write(rows, args)

    run_missing(__file__, rows, cells, done)
    write(rows, args)


if __name__ == "__main__":
    main()
