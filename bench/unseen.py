"""Does a recipe's gain carry to text the benchmarks never saw? SmolLM2-135M on another domain.

Every recipe is calibrated as in ``docs/results/criteria.md`` (128 × 128 tokens of the Wikipedia
calibration articles) and evaluated twice: on the Wikipedia evaluation split (20 windows of 512
tokens, the benchmarks' usual number) and on Rotten Tomatoes review snippets (the 1,275 test snippets
of ``bench/assets.rotten_tomatoes_split``, blank-line separated, 20 windows of 512 tokens) — text that
no benchmark calibrates on or chooses a recipe by. Recipes: paper-exact FLAP + LIAR (the issue's
reference), the default (``head_ratio: auto``) and ``head_ratio: obs``. Each cell runs in its own
process, one at a time; finished cells are kept (resumable).

    python bench/unseen.py [--ratios 0.2 0.5] [--recipes paper auto obs] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cell_parser, cpu_line, heldout, run_cells, span, today, write_page  # noqa: E402
from bench.kv_groups import default_recipe  # noqa: E402

OUT = ROOT / "docs" / "results" / "unseen.md"
LABELS = {
    "dense": "dense",
    "paper": "paper-exact FLAP + LIAR (criterion's units, heads at the layer's ratio, exact widths)",
    "auto": "**uniform shares** (magnitude counts, OBS selection + `ls`, `head_ratio: auto`; "
    "the default above 50%, and at every ratio until 2026-11-25)",
    "obs": "uniform shares with `head_ratio: obs` (each layer's own split)",
}


def recipe(name: str, ratio: float) -> dict:
    from bench.assets import smollm2_recipe, wikipedia_split

    if name == "paper":
        return smollm2_recipe(wikipedia_split()[0], ratio, "liar", {"name": "flap"})
    return default_recipe(ratio, "free") | {"head_ratio": name}


def one(args) -> dict:
    """One cell, in a child process: prune (or load the dense model) and evaluate on both texts."""
    import torch

    from bench.assets import smollm2_dir
    from core import prune
    from core.models.loading import load_model

    torch.set_num_threads(args.threads)
    row = {"recipe": args.recipe, "ratio": args.ratio}
    if args.recipe == "dense":
        model, tok, _ = load_model(str(smollm2_dir()), "float32", "cpu")
    else:
        result = prune(recipe(args.recipe, args.ratio))
        model, tok = result.model, result.tokenizer
        row.update(
            achieved_ratio=result.achieved_ratio,
            prune_seconds=result.seconds,
            heads=sorted({len(lp.heads) for lp in result.plan.layers}),
            ffn=sorted({len(lp.neurons) for lp in result.plan.layers}),
        )
    return row | both_texts(model, tok)


def both_texts(model, tok) -> dict[str, float]:
    """Perplexity on 20 windows of 512 tokens of the Wikipedia evaluation split and of the Rotten
    Tomatoes test snippets (the page's two columns)."""
    from bench.assets import rotten_tomatoes_split, wikipedia_split

    texts = (("wikipedia", wikipedia_split()[1]), ("rotten_tomatoes", rotten_tomatoes_split()["test"]))
    return {name: heldout(model, tok, text=path)["perplexity"] for name, path in texts}


def wikipedia_perplexity(model, tok) -> float:
    """:func:`both_texts`' Wikipedia column alone (half the evaluation, for pages that quote only it)."""
    return heldout(model, tok)["perplexity"]


def write(rows: dict[str, dict], args) -> None:
    machine = cpu_line(args.threads)
    lines = [
        "# Unseen text: Wikipedia evaluation split vs Rotten Tomatoes reviews (SmolLM2-135M)",
        "",
        f"Measured {today()} on {machine}. Produced by `python bench/unseen.py`.",
        "",
        "Calibration: 128 × 128 tokens of the Wikipedia calibration articles for every recipe. Perplexity on",
        "20 windows of 512 tokens of the Wikipedia evaluation articles and of the Rotten Tomatoes test",
        "snippets (a domain no benchmark calibrates on or picks a recipe by). × paper: the ratio to",
        "paper-exact FLAP + LIAR at the same target.",
        "",
        "| target | recipe | removed | query heads per layer | FFN width | Wikipedia | × paper | Rotten Tomatoes "
        "| × paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(LABELS)
    for r in sorted(rows.values(), key=lambda r: (r["ratio"], order.index(r["recipe"]))):
        paper = rows.get(f"paper|{r['ratio']}")
        rel = {
            k: f"{r[k] / paper[k]:.2f}" if paper and r["recipe"] not in ("paper", "dense") else "–"
            for k in ("wikipedia", "rotten_tomatoes")
        }
        target = "–" if r["recipe"] == "dense" else f"{r['ratio']:.0%}"
        shape = f"{r['achieved_ratio']:.2%} | {span(r['heads'])} | {span(r['ffn'])}" if "heads" in r else "– | 9 | 1536"
        lines.append(
            f"| {target} | {LABELS[r['recipe']]} | {shape} | {r['wikipedia']:.2f} | {rel['wikipedia']} "
            f"| {r['rotten_tomatoes']:.2f} | {rel['rotten_tomatoes']} |"
        )
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = cell_parser(__doc__)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.2, 0.5])
    p.add_argument("--recipes", nargs="+", default=["paper", "auto", "obs"], choices=["paper", "auto", "obs"])
    p.add_argument("--recipe", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    todo = [("dense", 0.0)] + [(n, r) for r in args.ratios for n in args.recipes]
    cells = [(f"{n}|{r}", ["--ratio", str(r), "--recipe", n, "--threads", str(args.threads)]) for n, r in todo]
    key = lambda r: f"{r['recipe']}|{r['ratio']}"  # noqa: E731
    run_cells(__file__, args, one, OUT, key, cells, write, both_rounded)


def both_rounded(row: dict) -> list[float]:
    """What a script of cells prints of a row evaluated on both texts."""
    return [round(row["wikipedia"], 2), round(row["rotten_tomatoes"], 2)]


if __name__ == "__main__":
    main()
