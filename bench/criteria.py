"""Criteria × reconstruction on SmolLM2-135M: the analogue of the paper's Tables 2–3 on a real model.

Every criterion at ratios 0.2 and 0.5 with none / bias / liar / ls; perplexity on held-out Wikipedia
articles (setup of the engine benchmark: 128 × 128 calibration tokens, damping 0.001; 20 evaluation
windows of 512 tokens by default). Each finished cell is written to ``docs/results/criteria.json`` at
once, so an interrupted run resumes where
it stopped. Each criterion's cells run in one process, scoring the model once (``prune(scores=...)``).

    python bench/criteria.py [--criteria snip kwon flap+obs ...] [--ratios 0.2 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_line, heldout, today, write_page  # noqa: E402

OUT = ROOT / "docs" / "results" / "criteria.md"
METHODS = ("none", "bias", "liar", "ls")

FLAP_UL = {"name": "flap", "options": {"metric": "WIFV", "structure": "UL-UM"}}
FLAP_AL = {"name": "flap", "options": {"metric": "WIFV", "structure": "AL-AM"}}  # adaptive, global

# name → (label, criterion JSON, modules, allocation): each criterion in its source's own structure
SETUPS = {
    "magnitude": ("magnitude (L2, uniform)", {"name": "magnitude"}, "both", "uniform"),
    "flap": ("FLAP (WIFV, UL-UM)", FLAP_UL, "both", "uniform"),
    "snip": ("SNIP (uniform)", {"name": "snip"}, "both", "uniform"),
    "kwon": ("Kwon et al. (Fisher, mask search + rearrangement)", {"name": "kwon"}, "both", "global"),
    "taylor": ("LLM-Pruner Taylor (param_first, sum, uniform)", {"name": "taylor"}, "both", "uniform"),
    "kcm": ("KCM (R2×D2, neurons only)", {"name": "kcm"}, "neurons", "uniform"),
    "random": ("random (uniform)", {"name": "random"}, "both", "uniform"),
    "flap-al": ("FLAP (WIFV, AL-AM, global)", FLAP_AL, "both", "global"),
    # reconstruction-aware selection: the criterion's per-layer counts, the units chosen on the Gram
    "flap+obs": ("FLAP counts + OBS selection", FLAP_UL, "both", "uniform"),
    "magnitude+obs": ("magnitude counts + OBS selection", {"name": "magnitude"}, "both", "uniform"),
    "kwon+obs": ("Kwon et al. counts + OBS selection", {"name": "kwon"}, "both", "global"),
    "flap-al+obs": ("FLAP AL-AM counts + OBS selection", FLAP_AL, "both", "global"),
    # ... and error feedback: refit to the dense model's outputs
    "magnitude+obs+ef": (
        "magnitude counts + OBS selection + error feedback",
        {"name": "magnitude"},
        "both",
        "uniform",
    ),
}
# reconstruction fields of a setup beyond the method (the others keep the paper's selection)
RECONSTRUCTION = {
    "flap+obs": {"select": "obs"},
    "magnitude+obs": {"select": "obs"},
    "kwon+obs": {"select": "obs"},
    "flap-al+obs": {"select": "obs"},
    "magnitude+obs+ef": {"select": "obs", "target": "dense"},
}


def setup_methods(name: str) -> tuple[str, ...]:
    """The reconstructions a setup runs: selection assumes a refit (no none / bias cells), error
    feedback is an ls solve."""
    extra = RECONSTRUCTION.get(name)
    if extra is None:
        return METHODS
    return ("ls",) if extra.get("target") == "dense" else ("liar", "ls")


def _key(name: str, method: str, ratio: float) -> str:
    return f"{name}|{method}|{ratio}"


def run_criterion(name: str, cells: list[tuple[str, float]], eval_windows: int, on_row) -> None:
    """All cells of one criterion in this process: the scores are computed once and reused."""
    import torch

    from bench.assets import smollm2_dir, smollm2_recipe, wikipedia_split
    from core import prune
    from core.models.loading import load_model

    _, crit, modules, allocation = SETUPS[name]
    model_dir = smollm2_dir()
    calib, _ = wikipedia_split()
    scores = None
    for method, ratio in cells:
        torch.manual_seed(0)
        model, tok, _ = load_model(str(model_dir), "float32", "cpu")
        recipe = smollm2_recipe(calib, ratio, method, crit, modules=modules, allocation=allocation)
        recipe["reconstruction"].update(RECONSTRUCTION.get(name, {}))
        try:
            result = prune(recipe, model=model, tokenizer=tok, scores=scores)
        except Exception as exc:  # record and go on: the next run retries it
            on_row({"criterion": name, "method": method, "ratio": ratio, "error": f"{type(exc).__name__}: {exc}"})
            continue
        scores = result.scores
        ppl = heldout(result.model, tok, eval_windows)
        on_row(
            {
                "criterion": name,
                "method": method,
                "ratio": ratio,
                "achieved_ratio": result.achieved_ratio,
                "prune_seconds": result.seconds,
                "perplexity": ppl["perplexity"],
                "eval_tokens": ppl["tokens"],
            }
        )


def dense_row(eval_windows: int) -> dict:
    from bench.assets import smollm2_dir
    from core.models.loading import load_model

    model, tok, _ = load_model(str(smollm2_dir()), "float32", "cpu")
    ppl = heldout(model, tok, eval_windows)
    return {"criterion": "dense", "method": "dense", "ratio": 0.0, "perplexity": ppl["perplexity"]}


def load_rows(path: Path) -> dict[str, dict]:
    rows = {}
    if path.exists():
        for r in json.loads(path.read_text())["rows"]:
            rows["dense" if r["criterion"] == "dense" else _key(r["criterion"], r["method"], r["ratio"])] = r
    return rows


def write(rows: dict[str, dict], ratios: list[float], eval_windows: int) -> None:
    machine = cpu_line(suffix=" (CPU)")
    dense = rows.get("dense", {}).get("perplexity")
    lines = [
        "# Criteria × reconstruction on SmolLM2-135M",
        "",
        f"Updated {today()} on {machine}. Produced by `python bench/criteria.py` (resumable).",
        "",
        "Setup as in `engine.md`: 128 windows × 128 tokens of calibration from 70% of the Wikipedia articles,",
        f"damping 0.001, perplexity on the other 30% ({eval_windows} windows of 512 tokens)"
        + (f"; dense perplexity {dense:.2f}." if dense else "."),
        "Each criterion runs in its source's structure: Kwon et al. with their global mask search and",
        "rearrangement, KCM on FFN neurons only (the FFN holds ~75% of a block's parameters), the others",
        "uniform per layer over heads and neurons. Gradient criteria use the calibration windows' LM loss.",
        "A criterion's scores are computed once and reused for all its cells (they depend on neither the",
        "ratio nor the reconstruction).",
        "`removed` is the achieved fraction of block parameters (liar row).",
        "",
        "| criterion | target | removed | none | bias | liar | ls |",
        "|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "–" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:.1f}")  # noqa: E731
    for ratio in ratios:
        for name, (label, *_rest) in SETUPS.items():
            cells = [rows.get(_key(name, m, ratio)) for m in METHODS]
            if not any(cells):
                continue
            ppl = [None if c is None or "error" in c else c["perplexity"] for c in cells]
            done = next((c for c in cells[::-1] if c and "achieved_ratio" in c), None)
            removed = f"{done['achieved_ratio']:.1%}" if done else "–"
            lines.append(f"| {label} | {ratio:.0%} | {removed} | " + " | ".join(fmt(v) for v in ppl) + " |")
    failed = [r for r in rows.values() if "error" in r]
    if failed:
        lines += ["", "Failed cells (re-run to retry):", ""]
        lines += [f"- {r['criterion']} / {r['method']} @ {r['ratio']}: `{r['error'].splitlines()[-1]}`" for r in failed]
    write_page(OUT, lines, rows, machine)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--criteria", nargs="*", default=["snip", "kwon", "taylor", "kcm", "magnitude", "flap", "random"])
    p.add_argument("--ratios", nargs="*", type=float, default=[0.2, 0.5])
    p.add_argument("--eval-windows", type=int, default=20, help="512-token windows of held-out text")
    args = p.parse_args()
    unknown = [c for c in args.criteria if c not in SETUPS]
    if unknown:
        sys.exit(f"unknown criteria {unknown}; choose from {sorted(SETUPS)}")
    rows = load_rows(OUT.with_suffix(".json"))
    if "dense" not in rows:
        rows["dense"] = dense_row(args.eval_windows)
        write(rows, args.ratios, args.eval_windows)

    def on_row(r: dict) -> None:
        rows[_key(r["criterion"], r["method"], r["ratio"])] = r
        print(r["criterion"], r["method"], r["ratio"], r.get("perplexity", r.get("error")), flush=True)
        write(rows, args.ratios, args.eval_windows)

    for name in args.criteria:
        todo = [
            (m, ratio)
            for ratio in args.ratios
            for m in setup_methods(name)
            if _key(name, m, ratio) not in rows or "error" in rows[_key(name, m, ratio)]
        ]
        if todo:
            run_criterion(name, todo, args.eval_windows, on_row)
    write(rows, args.ratios, args.eval_windows)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
