"""Quality against realised speed on the CPU: width-only, depth-only and combined recipes on SmolLM2-135M.

Every recipe is pruned with the default recipe's calibration (128 × 128 tokens of the Wikipedia
calibration articles), evaluated on the first 20 windows of 512 tokens of the held-out Wikipedia
articles, and kept in memory; then the timings go in rounds over all models (so a slow stretch of the
machine falls on every model alike), each cell the median over the rounds:

- decode: batch-1 greedy decoding, ms per token (32 new tokens after a 128-token prompt, eager, the
  default key/value cache, the prompt's prefill not counted: ``core.evaluation.speed.decode_ms_per_token``);
- prefill: tokens/s of one forward over 8 × 512 tokens.

The GEMM rate of the same machine in the same run is recorded beside them (``bench.flops.gemm_rate``),
so the speeds can be read against the machine.

``--model`` takes the other real decoders of ``bench/assets.py``, quality only so far (``--no-timing``,
their own recipes below, their pages ``depth_speed_<model>.md``): on a machine shared with other work the
speed rounds would measure the other work.

    python bench/depth_speed.py [--rounds 5] [--only NAME ...]
    python bench/depth_speed.py --model gemma3 --no-timing [--only NAME ...]
    python bench/depth_speed.py --report-only [--model NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import DECODERS  # noqa: E402
from bench.common import header, today  # noqa: E402

OUT = ROOT / "docs" / "results" / "depth_speed.md"
# name: (modules, ratio, depth blocks, depth reconstruction); SmolLM2 has 30 blocks
RECIPES = {
    "width 20%": ("both", 0.2, 0, "ls"),
    "width 35%": ("both", 0.35, 0, "ls"),
    "width 50%": ("both", 0.5, 0, "ls"),
    "depth 6 (20%)": ("blocks", 0.2, 0, "ls"),
    "depth 8 (27%)": ("blocks", 8 / 30, 0, "ls"),
    "depth 8 (27%), none": ("blocks", 8 / 30, 0, "none"),
    "depth 10 (33%)": ("blocks", 1 / 3, 0, "ls"),
    "depth 4 + width, 35%": ("both", 0.35, 4, "ls"),
    "depth 4 + width, 50%": ("both", 0.5, 4, "ls"),
    "depth 6 + width, 50%": ("both", 0.5, 6, "ls"),
    "depth 8 + width, 50%": ("both", 0.5, 8, "ls"),
    # the structures of the H100 decode run at about 40% (gpu_latency_depth.md): their quality on SmolLM2
    "depth 6 + width, 41%": ("both", 0.41, 6, "ls"),
    "depth 8 + width, 40%": ("both", 0.40, 8, "ls"),
    "depth 9 + width, 40%": ("both", 0.395, 9, "ls"),
}
TIMED = list(RECIPES)[:11]  # the recipes the speed rounds time (the rest: perplexity only, --no-timing)
# The other models' recipes, quality only: width only at the depth rows' removed share and at 50%, depth
# alone, depth + width to 50%.
MODEL_RECIPES = {
    "smollm2": RECIPES,
    # 18 blocks; the recipe check refuses the ls stand-in for Gemma 3 (its FFN output is normalised), so
    # every depth row is plain removal, the span chosen by the held-aside loss with it removed (SLEB)
    "gemma3": {
        "width 22%": ("both", 4 / 18, 0, "none"),
        "depth 4 (22%), none": ("blocks", 4 / 18, 0, "none"),
        "width 50%": ("both", 0.5, 0, "none"),
        "depth 4 + width, 50%, none": ("both", 0.5, 4, "none"),
        "depth 2 + width, 50%, none": ("both", 0.5, 2, "none"),
    },
    # 24 blocks
    "qwen25": {
        "width 25%": ("both", 0.25, 0, "ls"),
        "depth 6 (25%)": ("blocks", 0.25, 0, "ls"),
        "depth 6 (25%), none": ("blocks", 0.25, 0, "none"),
        "width 50%": ("both", 0.5, 0, "ls"),
        "depth 6 + width, 50%": ("both", 0.5, 6, "ls"),
    },
}


def out_path(model: str) -> Path:
    """SmolLM2's page is ``depth_speed.md`` (the first one); another model's ``depth_speed_<model>.md``."""
    return OUT if model == "smollm2" else OUT.with_name(f"depth_speed_{model}.md")


def recipe_for(name: str, model: str = "smollm2") -> dict:
    from bench.unseen import recipe as bench_recipe

    modules, ratio, blocks, recon = MODEL_RECIPES[model][name]
    r = bench_recipe("auto", ratio) | {"allocation": "auto", "criterion": {"name": "auto"}, "modules": modules}
    if modules == "blocks" or blocks:
        r["depth"] = {"blocks": blocks, "reconstruction": recon}
    if model != "smollm2":
        r["model"] = str(DECODERS[model].checkpoint())
    return r


def pruned_row(name: str, result) -> dict:
    """A pruned recipe's structure and held-out perplexity."""
    from bench.unseen import wikipedia_perplexity

    return {
        "name": name,
        "achieved_ratio": result.achieved_ratio,
        "layers": result.model.config.num_hidden_layers,
        "removed_blocks": result.metrics.get("depth_blocks_removed", []),
        "width_ratio": result.metrics.get("width_ratio"),
        "perplexity": wikipedia_perplexity(result.model, result.tokenizer),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=DECODERS, default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None, help="recipe names (default: all)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument(
        "--no-timing", action="store_true", help="perplexity only, rows added to the existing page (no speed rounds)"
    )
    args = ap.parse_args()
    js = out_path(args.model).with_suffix(".json")
    if args.report_only:
        write(json.loads(js.read_text()))
        return
    if args.no_timing:
        quality_only(args, js)
        return
    if args.model != "smollm2":
        ap.error(f"--model {args.model} is measured quality only for now: add --no-timing")
    import torch
    import torch.nn.functional as F

    from bench.assets import smollm2_dir
    from bench.flops import gemm_rate
    from bench.unseen import both_texts
    from core import prune
    from core.evaluation.speed import decode_ms_per_token, prefill_tokens_per_second
    from core.models.loading import load_model

    torch.set_num_threads(args.threads)
    results = {
        **header(),
        "threads": args.threads,
        "rows": [],
    }
    models = {}
    dense, tok, _ = load_model(str(smollm2_dir()), "float32", "cpu")
    models["dense"] = dense
    results["rows"].append({"name": "dense", "perplexity": both_texts(dense, tok)["wikipedia"], "layers": 30})
    for name in args.only or TIMED:
        result = prune(recipe_for(name))
        row = pruned_row(name, result) | {"prune_seconds": result.seconds}
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
        models[name] = result.model
        js.write_text(json.dumps(results, indent=1) + "\n")
    samples: dict[str, dict[str, list[float]]] = {n: {"decode_ms": [], "prefill_tok_s": []} for n in models}
    gemm = []
    for r in range(args.rounds):
        gemm.append(gemm_rate(F.linear))
        for name, model in models.items():
            if r == 0:
                decode_ms_per_token(model, new=4)  # warm-up
            samples[name]["decode_ms"].append(decode_ms_per_token(model))
            samples[name]["prefill_tok_s"].append(prefill_tokens_per_second(model, batch=8, seq_len=512, repeats=1))
        print(f"round {r + 1}", flush=True)
    results["gemm_gflops"] = statistics.median(gemm)
    for row in results["rows"]:
        s = samples[row["name"]]
        row.update({k: statistics.median(v) for k, v in s.items()}, **{f"{k}_all": v for k, v in s.items()})
    js.write_text(json.dumps(results, indent=1) + "\n")
    write(results)


def quality_only(args, js: Path) -> None:
    """Prune and evaluate ``--only`` recipes into the model's results (SmolLM2's default: the recipes
    not timed; another model's: ``dense`` and all of its recipes, into a file of its own)."""
    import torch

    from core import prune

    torch.set_num_threads(args.threads)
    if js.exists():
        results = json.loads(js.read_text())
    else:  # another model's first run
        results = {
            **header(),
            "threads": args.threads,
            "model": args.model,
            "label": DECODERS[args.model].label,
            "weights": DECODERS[args.model].weights,
            "rows": [],
        }
    results.setdefault("untimed", [])
    recipes = MODEL_RECIPES[args.model]
    default = [n for n in RECIPES if n not in TIMED] if args.model == "smollm2" else ["dense", *recipes]
    for name in args.only or default:
        if name == "dense":
            row = dense_row(args.model) | {"date": today()}
        else:
            result = prune(recipe_for(name, args.model))
            row = pruned_row(name, result) | {"date": today()}
            if result.metrics.get("depth_reconstruction"):
                row["depth_reconstruction"] = result.metrics["depth_reconstruction"]
            del result
        print(json.dumps(row), flush=True)
        results["untimed"] = [x for x in results["untimed"] if x["name"] != name] + [row]
        js.write_text(json.dumps(results, indent=1) + "\n")
    write(results)


def dense_row(model: str) -> dict:
    """The dense model's row of a quality-only page, and the recipe check's sentence when it refuses the
    least-squares stand-in for the model's family (the page says why its depth rows are ``none``)."""
    from bench.depth import ls_refusal
    from bench.unseen import wikipedia_perplexity
    from core.models.loading import load_model

    path = str(DECODERS[model].checkpoint())
    dense, tok, _ = load_model(path, "float32", "cpu")
    n = dense.config.num_hidden_layers
    row = {"name": "dense", "achieved_ratio": 0.0, "layers": n, "removed_blocks": [], "width_ratio": None}
    row["perplexity"] = wikipedia_perplexity(dense, tok)
    refused = ls_refusal(path, dense.config, max(1, n // 4))
    return row | ({"ls_refused": refused} if refused else {})


def _shape(x: dict) -> tuple[str, str]:
    """A row's span of removed blocks and its width share (– for none; all: a width-only prune)."""
    blocks = x.get("removed_blocks") or []
    span = f"{blocks[0]}–{blocks[-1]}" if blocks else "–"
    width = f"{x['width_ratio']:.1%}" if x.get("width_ratio") else ("–" if blocks or x["name"] == "dense" else "all")
    return span, width


def write(r: dict) -> None:
    if r.get("model", "smollm2") != "smollm2":
        write_quality(r)
        return
    dense = r["rows"][0]
    lines = []
    for x in r["rows"]:
        span, width = _shape(x)
        lines.append(
            f"| {x['name']} | {x.get('achieved_ratio', 0):.1%} | {x['layers']} | {span} | {width} | "
            f"{x['perplexity']:.1f} | {x['decode_ms']:.1f} ({dense['decode_ms'] / x['decode_ms']:.2f}×) | "
            f"{x['prefill_tok_s']:,.0f} ({x['prefill_tok_s'] / dense['prefill_tok_s']:.2f}×) |"
        )
    table = "\n".join(lines)
    untimed = "\n".join(
        f"| {x['name']} | {x['achieved_ratio']:.1%} | {x['layers']} | {' | '.join(_shape(x))} | {x['perplexity']:.1f} |"
        for x in r.get("untimed", [])
    )
    if untimed:
        untimed = (
            "\nPerplexity only (`--no-timing`): the structures whose decode speed the H100 measured at about 40% "
            "([gpu_latency_depth.md](gpu_latency_depth.md)), on SmolLM2's 30 blocks\n\n"
            "| recipe | removed | layers | span removed | width share | perplexity |\n|---|---|---|---|---|---:|\n"
            + untimed
            + "\n"
        )
    OUT.write_text(f"""# Quality against realised CPU speed: width, depth and both (SmolLM2-135M)

`python bench/depth_speed.py`, measured {r["date"]} ({r["machine"]}, torch {r["torch"]}, {r["threads"]} threads;
float32 GEMM rate in the same run {r["gemm_gflops"]:.0f} GFLOP/s). Every recipe is the default recipe
(criterion auto, ls reconstruction, the default calibration: 128 × 128 tokens of the Wikipedia calibration
articles) with the depth settings named; depth spans chosen by `select: loss` and replaced by the
least-squares stand-in (`reconstruction: ls`) unless marked `none`. Perplexity: the first 20 windows of 512
tokens of the held-out Wikipedia articles. Decode: batch-1 greedy decoding, ms per token (32 new tokens
after a 128-token prompt, eager, the prompt's prefill not counted); prefill: one forward over 8 × 512
tokens. Speed cells: the median of
{len(dense["decode_ms_all"])} rounds that interleave the models; speed-ups against dense in brackets.

| recipe | removed | layers | span removed | width share | perplexity | decode ms/token | prefill 8×512 tok/s |
|---|---|---|---|---|---:|---:|---:|
{table}
{untimed}""")
    print(f"wrote {OUT}")


def write_quality(r: dict) -> None:
    """Another model's page: held-out perplexity of its recipes, no speed column."""
    out, model = out_path(r["model"]), r["model"]
    order = ["dense", *MODEL_RECIPES[model]]
    rows = sorted(r["untimed"], key=lambda x: order.index(x["name"]) if x["name"] in order else len(order))
    dense = next((x for x in rows if x["name"] == "dense"), None)
    lines = []
    for x in rows:
        span, width = _shape(x)
        recon = x.get("depth_reconstruction", "–") if x.get("removed_blocks") else "–"
        ratio = f" ({x['perplexity'] / dense['perplexity']:.2f}×)" if dense and x is not dense else ""
        lines.append(
            f"| {x['name']} | {x['achieved_ratio']:.1%} | {x['layers']} | {span} | {recon} | {width} | "
            f"{x['perplexity']:.1f}{ratio} |"
        )
    dates = sorted({x["date"] for x in rows})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    why = ""
    if dense and dense.get("ls_refused"):
        why = (
            f"\nNo `ls` depth rows: the recipe check refuses the least-squares stand-in here, in its own words: "
            f'"{dense["ls_refused"]}". Every depth row removes its span plainly (`reconstruction: none`), the span '
            "chosen by `select: loss`, which with `none` is SLEB's criterion (the held-aside loss with the span "
            f"removed); [depth_{model}.md](depth_{model}.md) compares it with the angular distance (ShortGPT).\n"
        )
    out.write_text(f"""# Quality of width, depth and both on {r["label"]} (held-out perplexity, no timings)

`python bench/depth_speed.py --model {model} --no-timing`, measured {when} ({r["machine"]}, torch {r["torch"]},
{r["threads"]} threads). Quality only: the machine was shared with other work, so no speed was measured (SmolLM2's
page, [depth_speed.md](depth_speed.md), has the CPU speeds of like structures). Every recipe is the default recipe
(criterion auto, the default calibration: 128 × 128 tokens of the Wikipedia calibration articles) with the depth
settings named; depth spans chosen by `select: loss`. Perplexity: the first 20 windows of 512 tokens of the
held-out Wikipedia articles; in brackets, over dense. Weights: {r["weights"]} (`bench/assets.py`).
{why}
| recipe | removed | layers | span removed | depth reconstruction | width share | perplexity |
|---|---|---|---|---|---|---:|
{chr(10).join(lines)}
""")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
