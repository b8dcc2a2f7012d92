"""Depth pruning on a real decoder: a span of whole blocks removed, plainly or stood in for by a
least-squares linear map folded into the down projection before it (``core/depth/replace.py``).

One calibration pass (the default recipe's calibration: 128 windows of 128 tokens of the Wikipedia
calibration articles) records every block's output and FFN output, so the statistics of every
candidate span of ``--blocks`` blocks (starting at block 1 or later) come from the same tokens. Spans
are chosen three ways: the least plain-removal error, the least angular distance between the span's
input and output (ShortGPT), and the least error of the least-squares stand-in (ours). Each chosen
span is then removed plainly (``none``) and with the stand-in (``ls``), and every model is evaluated
on the first 20 windows of 512 tokens of the held-out Wikipedia articles, the protocol of the later
results pages (obs_allocation, unseen, …).

``--model`` takes the other real decoders of ``bench/assets.py`` (their pages: ``depth_<model>.md``).
Where the recipe check refuses the stand-in for the model's family (Gemma 3 normalises the FFN's output
before the residual stream, so the map has no linear place to go), the rows are plain removal only,
with the span chosen by the held-aside loss with the span removed (SLEB's criterion), the angular
distance and the plain error, and the page quotes the refusal.

    python bench/depth.py                 # 8 of 30 blocks (27%); --blocks 7 for 23%
    python bench/depth.py --model gemma3 --blocks 4 --no-timing    # 4 of 18 blocks (22%)
    python bench/depth.py --model qwen25 --blocks 6 --no-timing    # 6 of 24 blocks (25%)
    python bench/depth.py --report-only [--model NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import DECODERS  # noqa: E402
from bench.common import header  # noqa: E402

OUT = ROOT / "docs" / "results" / "depth.md"
DAMP = 0.01
# --selections: the span criteria whose spans are evaluated (a span another one also picks is evaluated anyway)
SELECTIONS = {
    "plain": "plain error",
    "angular": "angular distance (ShortGPT)",
    "fit": "ls fit error",
    "sleb": "held-aside loss, span removed (SLEB)",
    "ours": "held-aside loss with the stand-in (ours, the default)",
}


def out_path(model: str) -> Path:
    """SmolLM2's page is ``depth.md`` (the first one); another model's ``depth_<model>.md``."""
    return OUT if model == "smollm2" else OUT.with_name(f"depth_{model}.md")


def calibration(tokenizer):
    """The default recipe's calibration: (fit batches, held-aside batches)."""
    from bench.unseen import recipe as bench_recipe
    from core.data.calibration import calibration_batches
    from core.pipeline.scoring import split_batches
    from core.spec.recipe import Recipe

    recipe = Recipe.model_validate(bench_recipe("auto", 0.2))  # the default recipe's calibration
    fit, held = calibration_batches(recipe.calibration, tokenizer, "decoder")
    size = recipe.calibration.batch_size or 16
    return split_batches(fit, size), split_batches(held, size)


def ls_refusal(path: str, config, blocks: int) -> str | None:
    """The recipe check's sentence when it refuses ``depth.reconstruction: ls`` for this model (``None``
    where the stand-in folds), so a page says in the tool's own words why it has no ``ls`` rows."""
    from core.pipeline.preflight import check_depth
    from core.spec.recipe import Recipe

    n = int(config.num_hidden_layers)
    recipe = Recipe.model_validate(  # outside the try: a recipe the bench got wrong is no refusal
        {
            "model": path,
            "ratio": blocks / n,
            "modules": "blocks",
            "depth": {"reconstruction": "ls"},
            "calibration": {"texts": ["the depth check reads no calibration text"]},
        }
    )
    try:
        check_depth(recipe, config)
    except ValueError as exc:
        return str(exc)
    return None


def span_statistics(model, adapter, batches, length: int, normalise: bool, stand_in: bool = True):
    """Every span [s, s + length), s ≥ 1: its stand-in (``T``, with ``stand_in``) and scores, from one
    calibration pass."""
    from core.depth.replace import fit_spans_weighted

    n = len(adapter.layers(model))
    spans = [(s, s + length) for s in range(1, n - length + 1)]
    weightings = (normalise,) if stand_in else ()
    rows = {}
    for (s, _), (fits, scores) in fit_spans_weighted(model, adapter, batches, spans, weightings).items():
        rows[s] = {"plain_error": scores["plain_error"], "angular": scores["angular_distance"]}
        if stand_in:
            t = fits[normalise].solve(DAMP)
            rows[s] |= {"ls_error": fits[normalise].relative_error(t), "T": t}
    return rows


def _chosen(stats: dict, sleb, ours) -> dict[str, int]:
    """The span each selection picks (``ours`` None: the stand-in is refused); records the held-aside
    losses of every candidate in ``stats``."""
    stand_in = ours is not None
    chosen = {
        "plain error": min(stats, key=lambda s: stats[s]["plain_error"]),
        "angular distance (ShortGPT)": min(stats, key=lambda s: stats[s]["angular"]),
    }
    if stand_in:
        chosen["ls fit error"] = min(stats, key=lambda s: stats[s]["ls_error"])
    chosen["held-aside loss, span removed (SLEB)"] = sleb.start
    if stand_in:
        chosen["held-aside loss with the stand-in (ours, the default)"] = ours.start
    for s, cand in sleb.candidates.items():
        if stand_in:
            stats[s]["heldout_loss_ls"] = ours.candidates[s]["loss"]
        stats[s]["heldout_loss_none"] = cand["loss"]
    return chosen


def _removed_perplexity(path: str, adapter, tok, blocks: range, t) -> float:
    """Wikipedia perplexity of the model at ``path`` with ``blocks`` removed (``t``: the stand-in folded in
    their place, None: none)."""
    from bench.unseen import wikipedia_perplexity
    from core.depth.replace import fold, remove_blocks
    from core.models.loading import load_model

    pruned, _, _ = load_model(path, "float32", "cpu")
    if t is not None:
        fold(pruned, adapter, blocks.start, t.float())
    remove_blocks(pruned, adapter, list(blocks))
    return wikipedia_perplexity(pruned, tok)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=DECODERS, default="smollm2")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--plain-ls", action="store_true", help="unweighted least squares (default: per-token 1/‖y‖)")
    ap.add_argument(
        "--no-timing", action="store_true", help="quality only: no fit or selection times (on a shared machine)"
    )
    ap.add_argument(
        "--selections",
        nargs="+",
        choices=SELECTIONS,
        default=list(SELECTIONS),
        help="evaluate the spans of these criteria only (every criterion's span is still reported)",
    )
    return ap


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    if not {"sleb", "ours"} <= set(args.selections):
        ap.error("--selections needs sleb and ours: the page compares the other criteria's spans with theirs")
    js = out_path(args.model).with_suffix(".json")
    if args.report_only:
        write(json.loads(js.read_text()))
        return
    import torch

    from bench.unseen import wikipedia_perplexity
    from core.depth.select import choose_span
    from core.models.adapter import adapter_for
    from core.models.loading import load_model

    label, checkpoint, weights = DECODERS[args.model]
    path = str(checkpoint())
    torch.set_num_threads(args.threads)
    model, tok, _ = load_model(path, "float32", "cpu")
    adapter = adapter_for(model)
    n_layers = len(adapter.layers(model))
    refused = ls_refusal(path, model.config, args.blocks)
    stand_in = refused is None
    fit, held = calibration(tok)
    t0 = time.perf_counter()
    stats = span_statistics(model, adapter, fit, args.blocks, not args.plain_ls, stand_in)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = choose_span(model, adapter, fit, held, args.blocks, "loss", "ls", DAMP) if stand_in else None
    choose_s = time.perf_counter() - t0
    sleb = choose_span(model, adapter, fit, held, args.blocks, "loss", "none", DAMP)
    chosen = _chosen(stats, sleb, ours)
    results = {
        **header(),
        "blocks_removed": args.blocks,
    }
    if args.model != "smollm2":
        family = adapter.family.label or adapter.family.name
        results |= {"model": args.model, "label": label, "weights": weights, "family": family}
    if stand_in:
        results["weighting"] = "none" if args.plain_ls else "per-token 1/‖y‖"
    else:
        results |= {"ls_refused": refused, "ffn_output_norm": adapter.family.ffn_output_norm}
    results["blocks_total"] = n_layers
    if not args.no_timing:
        results |= {"fit_seconds": round(fit_s, 1)} | ({"choose_seconds": round(choose_s, 1)} if stand_in else {})
    if stand_in:
        results["ours_weighting"] = "per-token" if ours.weighted else "plain"
    results |= {
        "dense": wikipedia_perplexity(model, tok),
        "spans": {str(s): {k: v for k, v in r.items() if k != "T"} for s, r in stats.items()},
        "rows": [],
    }
    print("dense", results["dense"], flush=True)
    del model
    methods = ("none", "ls") if stand_in else ("none",)
    wanted = {SELECTIONS[k] for k in args.selections}
    evaluate = {(start, m) for how, start in chosen.items() if how in wanted for m in methods}
    done = set()
    for how, start in chosen.items():
        for method in methods:
            if (start, method) in done:
                results["rows"].append({"selection": how, "start": start, "method": method, "same_as_above": True})
                continue
            if (start, method) not in evaluate:
                results["rows"].append({"selection": how, "start": start, "method": method, "not_evaluated": True})
                continue
            done.add((start, method))
            t = None if method != "ls" else ours.t if how.startswith("held-aside loss with") else stats[start]["T"]
            ppl = _removed_perplexity(path, adapter, tok, range(start, start + args.blocks), t)
            results["rows"].append({"selection": how, "start": start, "method": method, "perplexity": ppl})
            print(how, start, method, ppl, flush=True)
            js.write_text(json.dumps(results, indent=2) + "\n")
    js.write_text(json.dumps(results, indent=2) + "\n")
    write(results)


def write(r: dict) -> None:
    if r.get("model", "smollm2") == "smollm2":
        write_smollm2(r)
    else:
        write_model(r)


def span_name(start: int, n: int) -> str:
    return f"{start}–{start + n - 1}"


def _span_table(r: dict, n: int, stand_in: bool) -> str:
    """The six spans with the least held-aside loss, with their local scores."""
    by = "heldout_loss_ls" if stand_in else "heldout_loss_none"
    spans = sorted(r["spans"].items(), key=lambda kv: kv[1][by])[:6]
    if stand_in:
        heads = ("held-aside loss, ls", "held-aside loss, removed", "ls fit error", "plain error", "angular distance")
        cells = ("heldout_loss_ls", "heldout_loss_none", "ls_error", "plain_error", "angular")
    else:
        heads = ("held-aside loss, removed", "plain error", "angular distance")
        cells = ("heldout_loss_none", "plain_error", "angular")
    span_head = "| blocks | " + " | ".join(heads) + " |\n|---|" + "---:|" * len(heads)
    span_rows = "\n".join(
        f"| {span_name(int(s), n)} | " + " | ".join(f"{v[c]:.3f}" for c in cells) + " |" for s, v in spans
    )
    return f"{span_head}\n{span_rows}"


def _rows_table(r: dict, n: int) -> str:
    """The rows of the page's first table: each selection's span, reconstruction and perplexity."""
    measured = {(x["start"], x["method"]): x["perplexity"] for x in r["rows"] if "perplexity" in x}
    return "\n".join(
        f"| {x['selection']} | {span_name(x['start'], n)} | {x['method']} | "
        + ("not evaluated" if x.get("not_evaluated") else f"{measured[(x['start'], x['method'])]:.1f}")
        + (" (the span above)" if x.get("same_as_above") else "")
        + " |"
        for x in r["rows"]
    )


def write_model(r: dict) -> None:
    """Another model's page: the same tables as SmolLM2's, without the ``ls`` columns where the recipe
    check refuses the stand-in, and what the numbers show said from the numbers."""
    out, n, total = out_path(r["model"]), r["blocks_removed"], r["blocks_total"]
    stand_in = "ls_refused" not in r
    rows = _rows_table(r, n)
    span_table = _span_table(r, n, stand_in)
    plain = {x["start"]: x["perplexity"] for x in r["rows"] if x["method"] == "none" and "perplexity" in x}
    best_plain = min(plain, key=plain.get)
    chosen = {x["selection"]: x["start"] for x in r["rows"]}
    sleb, angular = chosen[SELECTIONS["sleb"]], chosen[SELECTIONS["angular"]]
    angular_ppl = f" ({plain[angular]:.1f} removed)" if angular in plain else " (not evaluated)"
    agree = "picks the same span" if sleb == angular else f"picks {span_name(angular, n)}{angular_ppl}"
    shows = (
        f"SLEB's criterion picks {span_name(sleb, n)} (perplexity {plain[sleb]:.1f} removed, "
        f"{plain[sleb] / r['dense']:.2f}× dense); the angular distance {agree}."
    )
    if stand_in:
        ls = {x["start"]: x["perplexity"] for x in r["rows"] if x["method"] == "ls" and "perplexity" in x}
        ratio = ls[best_plain] / plain[best_plain]
        ours = chosen["held-aside loss with the stand-in (ours, the default)"]
        method = f"""`ls`: the span replaced by the linear map fitted by least squares (damping {DAMP} × the Gram's mean
diagonal, weighted {r.get("weighting", "per-token 1/‖y‖")}) and folded into the down projection of the block
before it — a stock {r["family"]} with {total - n} layers (`core/depth/replace.py`). `none`: the span removed."""
        verdict = f"""
On the best span for plain removal ({span_name(best_plain, n)}), the stand-in over plain removal: **{ratio:.2f}×**
(the issue's target, set for SmolLM2 at 25% of its blocks: ≤ 0.7×). The default (`select: loss` with `ls`) picks
{span_name(ours, n)}: perplexity {ls[ours]:.1f}, best plain removal {plain[best_plain]:.1f}. {shows}
"""
        spans_note = (
            "the stand-in picked per span between the per-token weighted and the plain fit, the chosen span's: "
        )
        spans_note += f"{r.get('ours_weighting', 'per-token')}"
        spans_title = f"The six spans with the least held-aside loss with the stand-in ({spans_note})"
    else:
        method = f"""`none`: the span removed; there are no `ls` rows. **Why:** the recipe check refuses the
least-squares stand-in for {r["family"]}, in its own words: "{r["ls_refused"]}". Its blocks normalise the FFN's
output (`{r.get("ffn_output_norm", "a norm")}`) before adding it to the residual stream, so the stand-in, a
linear map of the span's input folded into the down projection of the block before it, would pass through that
norm: it has no linear place to go. Depth on this model is plain removal, the span chosen on the calibration windows."""
        verdict = f"\n{shows}\n"
        spans_title = "The six spans with the least held-aside loss with the span removed (SLEB's criterion)"
    speed_page = f"depth_speed_{r['model']}.md"
    beside = ""
    if (out.parent / speed_page).exists():
        beside = f"\nWidth-only recipes at the same removed share, and depth + width: [{speed_page}]({speed_page}).\n"
    title = "plain removal against the least-squares stand-in" if stand_in else "plain removal (no stand-in)"
    out.write_text(f"""# Depth pruning on {r["label"]}: {title}

`python bench/depth.py --model {r["model"]} --blocks {n} --no-timing`, measured {r["date"]} ({r["machine"]},
torch {r["torch"]}); quality only (held-out perplexity, no times: the machine was shared with other work).
{n} of {total} blocks ({n / total:.0%}) removed as one contiguous span; the spans' statistics from the default
recipe's calibration (128 × 128 tokens of the Wikipedia calibration articles); held-out perplexity on the first
20 windows of 512 tokens of the Wikipedia evaluation articles (dense: {r["dense"]:.2f}). Weights: {r["weights"]}
(`bench/assets.py`). {method}

| span chosen by | blocks | reconstruction | perplexity |
|---|---|---|---:|
{rows}
{verdict}
{spans_title}, with the local scores (relative errors on the calibration tokens; next-token loss on the
calibration's 8 held-aside windows of 128 tokens):

{span_table}
{beside}""")
    print(f"wrote {out}")


def write_smollm2(r: dict) -> None:
    best_plain = min(x["perplexity"] for x in r["rows"] if x["method"] == "none" and "perplexity" in x)
    best_ls = min(x["perplexity"] for x in r["rows"] if x["method"] == "ls" and "perplexity" in x)
    ratio = best_ls / best_plain
    OUT.write_text(f"""# Depth pruning on SmolLM2-135M: plain removal against the least-squares stand-in

`python bench/depth.py --blocks {r["blocks_removed"]}`, measured {r["date"]} ({r["machine"]}, torch {r["torch"]}),
least squares weighted {r.get("weighting", "per-token 1/‖y‖")}.
{r["blocks_removed"]} of {r["blocks_total"]} blocks ({r["blocks_removed"] / r["blocks_total"]:.0%}) removed as one
contiguous span; the span's statistics from the default recipe's calibration (128 × 128 tokens of the Wikipedia
calibration articles, {r["fit_seconds"]} s for every candidate span in one pass); held-out perplexity on the first
20 windows of 512 tokens of the Wikipedia evaluation articles (dense: {r["dense"]:.2f}). `ls`: the span replaced
by the linear map fitted by least squares (damping {DAMP} × the Gram's mean diagonal) and folded into the down
projection of the block before it — a stock LLaMA with {r["blocks_total"] - r["blocks_removed"]} layers
(`core/depth/replace.py`). `none`: the span removed.

| span chosen by | blocks | reconstruction | perplexity |
|---|---|---|---:|
{_rows_table(r, r["blocks_removed"])}

Best `ls` over best plain removal: **{ratio:.2f}×** (target ≤ 0.7×: {"met" if ratio <= 0.7 else "not met"}).

The six spans with the least held-aside loss with the stand-in (next-token loss on the calibration's 8
held-aside windows of 128 tokens, {r.get("choose_seconds", "–")} s for the fits and every candidate's loss; the
stand-in picked per span between the per-token weighted and the plain fit, the chosen span's: {
        r.get("ours_weighting", "per-token")
    }), with the local scores (relative errors on the calibration tokens):

{_span_table(r, r["blocks_removed"], True)}


**What this shows.** Block 11 changes the residual stream wholesale (plain error 0.99 for a span starting
there, 0.003 for the span right after it), which fits the massive activations known in LLaMA-style models:
a few tokens whose residual norm dwarfs the others' (not measured here). Local scores mislead around it: the
angular distance picks 11–18, where the stand-in blows up, and the stand-in's own fit error picks 1–8,
which it rescues (plain removal there is unusable) but not to the level of 12–19. The held-aside loss of
the model with the span replaced (`depth.select: loss`, the default) measures what matters end to end and
picks 12–19 with the stand-in; SLEB's criterion (the same loss with the span removed) picks the best span for
plain removal. Plain least squares over all tokens did not help on 12–19 (76.7 against 75.6 removed, an
earlier run); weighting each token by 1/‖y‖ (the direction the next block's RMS norm reads) does.
""")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
