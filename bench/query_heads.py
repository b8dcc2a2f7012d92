"""What vLLM's form costs: the default recipe against the default with ``query_heads: uniform``.

vLLM's DeciLM states one query-head count for every layer, so a checkpoint for it is pruned with
``query_heads: uniform`` (every layer keeps as many query heads; FFN widths and key/value heads still
follow the global ranking). This page measures what that constraint costs on SmolLM2-135M at 20% and
50%, with the default recipe's calibration and the later pages' evaluation (first 20 windows of 512
tokens of the held-out Wikipedia articles, and the Rotten Tomatoes snippets).

    python bench/query_heads.py
    python bench/query_heads.py --report-only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import header  # noqa: E402

OUT = ROOT / "docs" / "results" / "query_heads.md"
RATIOS = (0.2, 0.5)


def run(threads: int) -> dict:
    import torch

    from bench.unseen import both_texts
    from bench.unseen import recipe as bench_recipe
    from core import prune

    torch.set_num_threads(threads)
    rows = []
    for ratio in RATIOS:
        for heads in ("free", "uniform"):
            recipe = bench_recipe("auto", ratio) | {"allocation": "auto", "criterion": {"name": "auto"}}
            result = prune(recipe | {"query_heads": heads})
            row = {
                "ratio": ratio,
                "query_heads": heads,
                "achieved_ratio": result.achieved_ratio,
                "heads": [len(lp.heads) for lp in result.plan.layers],
                "ffn": [len(lp.neurons) for lp in result.plan.layers],
                **both_texts(result.model, result.tokenizer),
            }
            print(json.dumps({k: v for k, v in row.items() if k not in ("heads", "ffn")}), flush=True)
            rows.append(row)
    return {
        **header(),
        "rows": rows,
    }


def write(r: dict) -> None:
    by = {(x["ratio"], x["query_heads"]): x for x in r["rows"]}
    lines = []
    for ratio in RATIOS:
        free, uni = by[(ratio, "free")], by[(ratio, "uniform")]
        for x in (free, uni):
            cost = "" if x is free else f" ({x['wikipedia'] / free['wikipedia'] - 1:+.1%})"
            lines.append(
                f"| {ratio:.0%} | {x['query_heads']} | {x['achieved_ratio']:.2%} | {min(x['heads'])}–{max(x['heads'])} "
                f"| {min(x['ffn'])}–{max(x['ffn'])} | {x['wikipedia']:.1f}{cost} | {x['rotten_tomatoes']:.1f} |"
            )
    OUT.write_text(f"""# What vLLM's form costs: `query_heads: uniform` against the default recipe (SmolLM2-135M)

`python bench/query_heads.py`, measured {r["date"]} ({r["machine"]}, torch {r["torch"]}). The default recipe
(criterion auto → obs, allocation global) with its calibration (128 × 128 tokens of the Wikipedia calibration
articles), and the same with `query_heads: uniform`, which vLLM's DeciLM form needs (`liar export --format
vllm`); perplexity on the first 20 windows of 512 tokens of the held-out Wikipedia articles and on the Rotten
Tomatoes snippets. Kept query heads and FFN widths: the range over the 30 layers (dense: 9 heads, 1536).

| removed | query heads | achieved | heads per layer | FFN per layer | Wikipedia perplexity | Rotten Tomatoes |
|---|---|---:|---|---|---:|---:|
{chr(10).join(lines)}
""")
    print(f"wrote {OUT}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    js = OUT.with_suffix(".json")
    if not args.report_only:
        js.write_text(json.dumps(run(args.threads), indent=2) + "\n")
    write(json.loads(js.read_text()))


if __name__ == "__main__":
    main()
