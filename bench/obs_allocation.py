"""A gradient-free non-uniform allocation from OBS error curves (a prototype measured, not an engine option).

The default recipe spends the budget uniformly: every layer loses the same share. Here each layer's
share comes from how much output error its units leave behind once the rest is refitted: on the
*dense* model, the greedy OBS paths of o_proj (heads) and of the FFN's down projection (neurons)
(:func:`core.stats.select.obs_curve`, the same paths ``head_ratio: obs`` uses within a layer) give the
error after each removal; each unit's marginal error (non-decreasing along its path), divided by
the mean squared norm of the residual stream entering the block (``--norm resid``; the error a
block adds is read against the signal it is added to) or not (``--norm none``), becomes its score,
and ``allocation: global`` ranks all units of all layers by score per parameter removed. ``--cap``
limits a layer's removed heads and neurons to ``cap × ratio`` of each (by where the paths stop).
Then the default pipeline runs with those counts (OBS selection + ``ls``; FFN widths ×64).

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kv_groups import cell_parser, run_missing, saved_rows, span, write_page  # noqa: E402

OUT = ROOT / "docs" / "results" / "obs_allocation.md"
STEP = 32  # neurons per round of the FFN's path


def dense_statistics(model, adapter, batches, device="cpu"):
    """Per layer: InputStats of o_proj's and down_proj's inputs and the mean squared norm of the
    residual stream entering the block, on the dense model (all layers hooked at once; fine for a
    135M model, not for a 7B one)."""
    import torch

    from core.stats.accumulate import InputStats

    fam, layers = adapter.family, adapter.layers(model)
    attn = [InputStats(layer.get_submodule(fam.o).in_features) for layer in layers]
    ffn = [InputStats(layer.get_submodule(fam.ffn_out).in_features) for layer in layers]
    energy, tokens, mask = [0.0] * len(layers), [0] * len(layers), [None]

    def residual(li):
        def hook(_m, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            x = h.reshape(-1, h.shape[-1])
            if mask[0] is not None:
                x = x[mask[0].reshape(-1)]
            energy[li] += float(x.double().pow(2).sum())
            tokens[li] += x.shape[0]

        return hook

    handles = []
    for li, layer in enumerate(layers):
        handles.append(
            layer.get_submodule(fam.o).register_forward_pre_hook(lambda _m, a, s=attn[li]: s.add_batch(a[0], mask[0]))
        )
        handles.append(
            layer.get_submodule(fam.ffn_out).register_forward_pre_hook(
                lambda _m, a, s=ffn[li]: s.add_batch(a[0], mask[0])
            )
        )
        handles.append(layer.register_forward_pre_hook(residual(li), with_kwargs=True))
    try:
        with torch.no_grad():
            for b in batches:
                mask[0] = b.token_mask(adapter.kind, device)
                model.base_model(**b.model_inputs(adapter.kind, device))
    finally:
        for h in handles:
            h.remove()
    return attn, ffn, [e / n for e, n in zip(energy, tokens)]


def marginal_scores(curve, n_units: int, scale: float):
    """Each unit's marginal error along a greedy path (made non-decreasing), over ``scale``; units the
    path does not reach get +inf (never removed)."""
    import torch

    out, best = torch.full((n_units,), float("inf")), 0.0
    for j in range(1, len(curve.removed)):
        lo, hi = curve.removed[j - 1], curve.removed[j]
        best = max((curve.error[j] - curve.error[j - 1]) / (hi - lo), best)
        out[curve.order[lo:hi]] = best / scale
    return out


def one(args) -> dict:
    import torch

    from bench.assets import rotten_tomatoes_split, wikipedia_split
    from bench.unseen import recipe as bench_recipe
    from core import perplexity, prune
    from core.criteria.base import Scores
    from core.data.calibration import calibration_batches
    from core.models.loading import load_model
    from core.pipeline.scoring import split_batches
    from core.spec.recipe import Recipe
    from core.stats.select import obs_curve

    torch.set_num_threads(args.threads)
    rec = Recipe.model_validate(bench_recipe("auto", args.ratio) | {"allocation": "global"})
    model, tok, adapter = load_model(rec.model, "float32", "cpu")
    fit, held = calibration_batches(rec.calibration, tok, adapter.kind)
    t0 = time.perf_counter()
    attn, ffn, energy = dense_statistics(model, adapter, split_batches(fit, rec.calibration.batch_size))
    limit = args.cap * args.ratio if args.cap else 0.95
    fam, damp, scores = adapter.family, rec.reconstruction.damp, []
    for li, layer in enumerate(adapter.layers(model)):
        scale = energy[li] if args.norm == "resid" else 1.0
        heads = obs_curve(
            layer.get_submodule(fam.o).weight,
            attn[li],
            min(adapter.n_heads - 1, int(limit * adapter.n_heads)),
            adapter.head_dim,
            damp,
        )
        neurons = obs_curve(
            layer.get_submodule(fam.ffn_out).weight,
            ffn[li],
            int(min(limit, 0.95) * adapter.n_neurons),
            1,
            damp,
            step=STEP,
        )
        scores.append(
            Scores(marginal_scores(heads, adapter.n_heads, scale), marginal_scores(neurons, adapter.n_neurons, scale))
        )
    curves_s = time.perf_counter() - t0
    del attn, ffn
    result = prune(rec, model=model, tokenizer=tok, calibration=(fit, held), scores=scores)
    row = {
        "ratio": args.ratio,
        "cap": args.cap,
        "norm": args.norm,
        "achieved_ratio": result.achieved_ratio,
        "curves_seconds": round(curves_s, 1),
        "prune_seconds": round(result.seconds, 1),
        "layers": [[len(lp.heads), len(lp.neurons)] for lp in result.plan.layers],
    }
    for name, path in (("wikipedia", wikipedia_split()[1]), ("rotten_tomatoes", rotten_tomatoes_split()["test"])):
        row[name] = perplexity(result.model, result.tokenizer, str(path), seq_len=512, batch_size=4, max_windows=20)[
            "perplexity"
        ]
    return row


# the same recipes' references, from unseen.md (same calibration, evaluation and day's engine)
REFERENCE = {  # ratio: (paper-exact FLAP + LIAR, the default) on (Wikipedia, Rotten Tomatoes)
    0.2: ((44.09, 163.09), (40.24, 143.41)),
    0.5: ((156.52, 498.72), (113.21, 407.04)),
}


def write(rows: dict[str, dict], args) -> None:
    import datetime as dt

    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} torch threads"
    lines = [
        "# Non-uniform allocation from OBS error curves (SmolLM2-135M, a prototype)",
        "",
        f"Measured {dt.date.today().isoformat()} on {machine}. Produced by `python bench/obs_allocation.py`.",
        "",
        "Per-layer counts from the dense model's OBS error curves (see the script's docstring), then the",
        "default pipeline. × paper / × default: against paper-exact FLAP + LIAR and the default recipe",
        "(uniform shares, `head_ratio: auto`) at the same target (`unseen.md`).",
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
