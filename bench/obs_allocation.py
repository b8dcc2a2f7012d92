"""A gradient-free non-uniform allocation from OBS error curves: ``criterion: obs`` with ``allocation: global``.

Uniform shares spend the budget evenly: every layer loses the same share. Here each layer's
share comes from how much output error its units leave behind once the rest is refitted: on the
*dense* model, the greedy OBS paths of o_proj (heads) and of the FFN's down projection (neurons)
give the error after each removal; each unit's marginal error (non-decreasing along its path),
divided by the mean squared norm of the residual stream entering the block (``--norm resid``) or
not (``--norm none``), is its score, and ``allocation: global`` ranks all units of all layers by score
per parameter removed (``core/criteria/obs.py``). ``--cap`` sets ``max_layer_ratio`` to ``cap × ratio``.
Everything else is the default pipeline (OBS selection + ``ls``; FFN widths ×64); ``--default`` also
measures uniform shares (``criterion: magnitude``, ``head_ratio: auto``) at each ratio, the recipe the
default (``criterion: auto``) ran beyond 30% until it became capped obs counts, and the ``× uniform``
column's reference; ``--auto`` measures only the default itself (``criterion: auto``, as it resolves
today) at each ratio. ``--model gemma3``: Gemma 3 270M with the same calibration and evaluation.

Calibration and evaluation as in ``docs/results/unseen.md``: 128 × 128 tokens of the Wikipedia
calibration articles; perplexity on 20 windows of 512 tokens of the Wikipedia evaluation split and of
the Rotten Tomatoes test snippets. Each cell runs in its own process; finished cells are kept.

    python bench/obs_allocation.py [--ratios 0.2 0.5] [--caps 0 1.5] [--norm resid]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cell_parser, cpu_line, flags, run_cells, span, today, write_page  # noqa: E402
from bench.unseen import both_rounded  # noqa: E402

OUT = ROOT / "docs" / "results" / "obs_allocation.md"
STEP = 32  # neurons per round of the FFN's path (the criterion's default)


MODELS = ("smollm2", "gemma3")  # SmolLM2-135M; Gemma 3 270M (sandwich norms) as a second decoder


def one(args) -> dict:
    import torch

    from bench.assets import gemma3_270m_dir
    from bench.unseen import both_texts
    from bench.unseen import recipe as bench_recipe
    from core import prune

    torch.set_num_threads(args.threads)
    recipe = bench_recipe("auto", args.ratio)  # uniform shares, head_ratio auto, on SmolLM2's calibration
    if args.model == "gemma3":
        recipe["model"] = str(gemma3_270m_dir())
    if args.recipe == "obs":
        options = {"normalize": "residual" if args.norm == "resid" else "none", "step": STEP}
        if args.cap:
            options["max_layer_ratio"] = min(1.0, args.cap * args.ratio)
        recipe |= {"allocation": "global", "criterion": {"name": "obs", "options": options}}
    elif args.recipe == "auto":  # the default as it resolves today
        recipe |= {"allocation": "auto", "criterion": {"name": "auto"}}
    elif args.recipe == "paper":  # paper-exact FLAP + LIAR, the "× paper" reference (unseen.md's recipe)
        recipe = bench_recipe("paper", args.ratio) | {"model": recipe["model"]}
    result = prune(recipe)
    row = {
        "model": args.model,
        "recipe": args.recipe,
        "ratio": args.ratio,
        "cap": args.cap if args.recipe == "obs" else 0.0,  # "resolved" below: what auto ran
        "norm": args.norm if args.recipe == "obs" else "-",
        "achieved_ratio": result.achieved_ratio,
        "prune_seconds": round(result.seconds, 1),
        "layers": [[len(lp.heads), len(lp.neurons)] for lp in result.plan.layers],
        "resolved": {"criterion": result.recipe.criterion.model_dump(), "allocation": result.recipe.allocation},
    }
    return row | both_texts(result.model, result.tokenizer)


def key(r: dict) -> str:
    """A cell's key (rows measured before the model and recipe columns are SmolLM2's obs cells)."""
    return f"{r.get('model', 'smollm2')}|{r.get('recipe', 'obs')}|{r['ratio']}|{r['cap']}|{r['norm']}"


LABELS = {"smollm2": "SmolLM2-135M", "gemma3": "Gemma 3 270M"}

# the same recipes' references, from unseen.md (same calibration, evaluation and day's engine)
REFERENCE = {  # ratio: (paper-exact FLAP + LIAR, uniform shares) on (Wikipedia, Rotten Tomatoes)
    0.2: ((44.09, 163.09), (40.24, 143.41)),
    0.3: ((None, None), (54.33, None)),  # uniform's Wikipedia cell from head_ratio.md; no others measured
    0.5: ((156.52, 498.72), (113.21, 407.04)),
}


def write(rows: dict[str, dict], args) -> None:

    machine = cpu_line(args.threads)
    lines = [
        "# Non-uniform allocation from OBS error curves: `criterion: obs` (SmolLM2-135M, Gemma 3 270M)",
        "",
        f"Measured {today()} on {machine}. Produced by `python bench/obs_allocation.py`.",
        "",
        "`criterion: obs` with `allocation: global` (per-layer counts from the dense model's OBS error",
        "curves), then OBS selection + `ls`; uniform: every layer the same share, `head_ratio: auto`",
        "(magnitude counts). × paper / × uniform: against paper-exact FLAP + LIAR (SmolLM2: `unseen.md`;",
        "Gemma: its paper-exact row) and the uniform row of the same model and target. The default",
        "(`criterion: auto`) is obs on decoders up to 50%, with a soft cap of 1.2 × the ratio per layer",
        "above 30%, and uniform shares above 50%.",
        "",
        "| model | target | recipe | removed | query heads per layer | FFN width | Wikipedia | × paper | × uniform "
        "| Rotten Tomatoes | × paper | × uniform | prune s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def order(r: dict):
        kind = {"paper": 0, "default": 1, "auto": 2}.get(r.get("recipe", "obs"), 3)
        return (MODELS.index(r.get("model", "smollm2")), r["ratio"], kind, r["cap"] or 99)

    def default_cell(model: str, ratio: float) -> tuple:
        cell = rows.get(f"{model}|default|{ratio}|0.0|-")
        if cell:
            return cell["wikipedia"], cell["rotten_tomatoes"]
        return REFERENCE.get(ratio, (None, (None, None)))[1] if model == "smollm2" else (None, None)

    def paper_cell(model: str, ratio: float) -> tuple:
        cell = rows.get(f"{model}|paper|{ratio}|0.0|-")
        if cell:
            return cell["wikipedia"], cell["rotten_tomatoes"]
        return REFERENCE.get(ratio, ((None, None), None))[0] if model == "smollm2" else (None, None)

    for r in sorted(rows.values(), key=order):
        model = r.get("model", "smollm2")
        pw, pr = paper_cell(model, r["ratio"])
        dw, dr = default_cell(model, r["ratio"])
        heads = sorted({h for h, _ in r["layers"]})
        widths = sorted({n for _, n in r["layers"]})

        def rel(x, ref):
            return f"{x / ref:.2f}" if ref else "–"

        if r.get("recipe", "obs") == "default":
            what = "uniform"
        elif r.get("recipe") == "paper":
            what = "paper-exact FLAP + LIAR"
        elif r.get("recipe") == "auto":
            c = r["resolved"]["criterion"]
            cap = c["options"].get("max_layer_ratio")
            what = f"**the default** (→ {c['name']}" + (f", soft cap {cap:g}" if cap else "") + ")"
        else:
            what = "obs, cap " + (f"{r['cap']:g} × ratio" if r["cap"] else "none") + f", {r['norm']}"
        lines.append(
            f"| {LABELS[model]} | {r['ratio']:.0%} | {what} "
            f"| {r['achieved_ratio']:.2%} | {span(heads)} | {span(widths)} "
            f"| {r['wikipedia']:.2f} | {rel(r['wikipedia'], pw)} | {rel(r['wikipedia'], dw)} "
            f"| {r['rotten_tomatoes']:.2f} | {rel(r['rotten_tomatoes'], pr)} | {rel(r['rotten_tomatoes'], dr)} "
            f"| {r['prune_seconds']:.0f} |"
        )
    lines += ["", "Kept (heads, FFN width) per layer:", ""]
    for r in sorted(rows.values(), key=order):
        lines.append(
            f"- {LABELS[r.get('model', 'smollm2')]}, {r['ratio']:.0%}, {r.get('recipe', 'obs')}, "
            f"cap {r['cap'] or 'none'}, {r['norm']}: " + " ".join(f"{h}/{n}" for h, n in r["layers"])
        )
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = cell_parser(__doc__)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.2, 0.5])
    p.add_argument("--caps", nargs="+", type=float, default=[0.0, 1.5], help="0: no cap")
    p.add_argument("--norm", choices=["resid", "none"], default="resid")
    p.add_argument("--model", choices=MODELS, default="smollm2")
    p.add_argument("--default", action="store_true", help="also measure uniform shares at each ratio")
    p.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--recipe", choices=["obs", "default", "auto", "paper"], default="obs", help=argparse.SUPPRESS)
    p.add_argument("--paper", action="store_true", help="measure only paper-exact FLAP + LIAR at each ratio")
    p.add_argument("--auto", action="store_true", help="measure only today's default (criterion auto) at each ratio")
    args = p.parse_args()
    given = flags(args, "model", "norm", "threads")
    only = "auto" if args.auto else "paper" if args.paper else None
    cells = []
    if only:  # one recipe at each ratio, no obs cells
        cells = [(f"{args.model}|{only}|{r}|0.0|-", ["--recipe", only, "--ratio", str(r), *given]) for r in args.ratios]
    for r, c in [] if only else [(r, c) for r in args.ratios for c in args.caps]:
        if args.default:  # uniform shares at the same target, measured by this script
            cells.append((f"{args.model}|default|{r}|0.0|-", ["--recipe", "default", "--ratio", str(r), *given]))
        cells.append((f"{args.model}|obs|{r}|{c}|{args.norm}", ["--ratio", str(r), "--cap", str(c), *given]))
    run_cells(__file__, args, one, OUT, key, list(dict(cells).items()), write, both_rounded)


if __name__ == "__main__":
    main()
