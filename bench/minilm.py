"""Pruning a fine-tuned encoder: the analogue of the paper's Table 2 on MiniLM sentiment.

The classifier is all-MiniLM-L6-v2 fine-tuned on Rotten Tomatoes snippets (``bench/finetune_minilm.py``).
For each criterion (``--criteria``) and ratio (0.3, 0.5 by default) it prunes heads and neurons
with each reconstruction (none / bias / liar / ls), calibrating on samples of the *train* split
(with their labels, for gradient criteria), and reports accuracy on the *test* split, also relative
to the dense model. Scores are computed once per criterion (``prune(scores=...)``). Every finished
cell is written to ``docs/results/minilm.json`` at once, so an interrupted run resumes where it
stopped; the table goes to ``docs/results/minilm.md``.

    python bench/finetune_minilm.py --threads 1          # once: the dense classifier
    python bench/minilm.py                                # magnitude × {0.3, 0.5} × none/bias/liar/ls
    python bench/minilm.py --criteria magnitude,kwon,kcm,snip --ratios 0.3,0.5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import layer_errors, save_json, today  # noqa: E402

OUT = ROOT / "docs" / "results" / "minilm.md"
METHODS = ("none", "bias", "liar", "ls")
FIT_LABELS = {"all": "all tokens", "first": "[CLS] only", "pooled": "all; last block [CLS]"}

# Criteria whose sources prune in another structure than heads + neurons with a per-layer budget;
# --modules / --allocation given on the command line override these.
SETUP_DEFAULTS: dict[str, dict[str, Any]] = {
    "kwon": {"allocation": "global"},
    "kcm": {"modules": "neurons"},
    "flap": {"options": {"metric": "WIFV", "structure": "UL-UM"}},
}


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _setup(name: str, args) -> dict[str, Any]:
    base = {"modules": "both", "allocation": "uniform", "options": {}}
    base.update(SETUP_DEFAULTS.get(name, {}))
    if args.modules:
        base["modules"] = args.modules
    if args.allocation:
        base["allocation"] = args.allocation
    if args.criterion_options:
        base["options"] = {**base["options"], **json.loads(args.criterion_options)}
    return base


def _key(
    name: str,
    setup: dict[str, Any],
    ratio: float,
    method: str,
    positions: str = "all",
    select: str = "criterion",
    target: str = "pruned",
) -> str:
    opts = json.dumps(setup["options"], sort_keys=True) if setup["options"] else ""
    key = f"{name}{opts}|{setup['modules']}|{setup['allocation']}|{ratio}|{method}"
    key = key if positions == "all" else f"{key}|{positions}"
    key = key if select == "criterion" else f"{key}|select={select}"
    return key if target == "pruned" else f"{key}|target={target}"


def _machine() -> str:
    import torch

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"threads: {torch.get_num_threads()}, torch {torch.__version__} (CPU)"
    )


def _cell_recipe(args, model_dir: Path, name: str, setup: dict, ratio: float, method: str) -> dict:
    """The recipe of one cell of the table: criterion ``name`` as ``setup`` sets it up, at ``ratio``."""
    return {
        "model": str(model_dir),
        "ratio": ratio,
        "modules": setup["modules"],
        "allocation": setup["allocation"],
        "head_ratio": "same",  # the paper's uniform split (the default halves the heads' part)
        "criterion": {"name": name, "options": setup["options"]},
        "reconstruction": {
            "method": method,
            "damp": args.damp,
            "positions": args.positions,
            "select": args.select,
            "target": args.target,
        },
        "round_to": {"neurons": 1},  # exact widths: the table compares with the paper
        "dtype": "float32",
        "device": "cpu",
        "calibration": {
            "dataset": str(model_dir / "train.jsonl"),
            "text_field": "text",
            "label_field": "label",
            "num_calibration_samples": args.samples,
            "max_seq_length": args.max_length,
            "holdout_samples": args.holdout,
            "seed": args.seed,
            "batch_size": 32,
        },
    }


def _check_dense(state: dict, dense_acc: float, out_json: Path) -> None:
    """Refuse to add cells to a results file measured on another dense model."""
    if state.get("dense") and abs(state["dense"]["accuracy"] - dense_acc) > 1e-9:
        sys.exit(
            f"{out_json} was measured on a different dense model (accuracy {state['dense']['accuracy']:.4f}, "
            f"now {dense_acc:.4f}); rerun with --fresh"
        )


def _settings(args, test: list, state: dict, out_json: Path) -> dict:
    """The run's settings; a results file made with others is refused (``--fresh`` starts over)."""
    settings = {
        "samples": args.samples,
        "max_length": args.max_length,
        "damp": args.damp,
        "holdout": args.holdout,
        "test_examples": len(test),
    }
    if args.seed:  # which calibration snippets (seed 0 is the tables' and is left out of their settings)
        settings["seed"] = args.seed
    if state.get("settings") and state["settings"] != settings:
        sys.exit(f"{out_json} was made with other settings {state['settings']}; use them or rerun with --fresh")
    return settings


def run(args) -> dict:
    import torch

    from bench.assets import minilm_sentiment_dir, read_jsonl
    from core import prune
    from core.evaluation.encoder import evaluate_classifier
    from core.models.loading import load_model

    torch.set_num_threads(args.threads)
    model_dir = minilm_sentiment_dir()
    test = read_jsonl(model_dir / "test.jsonl")
    if args.test_limit:
        test = test[: args.test_limit]
    out_json = Path(args.out).with_suffix(".json")
    state: dict[str, Any] = json.loads(out_json.read_text()) if out_json.exists() and not args.fresh else {}
    state.setdefault("cells", {})

    def evaluate(model, tok) -> tuple[float, float]:
        t0 = time.perf_counter()
        acc = evaluate_classifier(model, tok, test, batch_size=128, max_length=args.max_length)["accuracy"]
        return acc, time.perf_counter() - t0

    model, tok, _ = load_model(str(model_dir), "float32", "cpu")
    dense_acc, _ = evaluate(model, tok)
    _check_dense(state, dense_acc, out_json)
    settings = _settings(args, test, state, out_json)
    state.update(
        dense={"accuracy": dense_acc, "parameters": sum(p.numel() for p in model.parameters())},
        settings=settings,
        model=str(model_dir.name),
        finetune=json.loads((model_dir / "metrics.json").read_text()),
    )
    print(f"dense test accuracy {dense_acc:.4f} on {len(test)} examples", flush=True)
    for name in _csv(args.criteria):
        setup = _setup(name, args)
        scores = None
        for ratio in (float(r) for r in _csv(args.ratios)):
            for method in _csv(args.methods):
                if args.target == "dense" and method != "ls":
                    continue  # error feedback is an exact least-squares refit
                key = _key(name, setup, ratio, method, args.positions, args.select, args.target)
                if key in state["cells"]:
                    print(f"{key}: done before ({state['cells'][key]['accuracy']:.4f})", flush=True)
                    continue
                torch.manual_seed(0)
                model, tok, _ = load_model(str(model_dir), "float32", "cpu")
                recipe = _cell_recipe(args, model_dir, name, setup, ratio, method)
                result = prune(recipe, model=model, tokenizer=tok, scores=scores)
                scores = result.scores
                acc, eval_s = evaluate(result.model, result.tokenizer)
                row = {
                    "criterion": name,
                    "options": setup["options"],
                    "modules": setup["modules"],
                    "allocation": setup["allocation"],
                    "ratio": ratio,
                    "method": method,
                    "positions": args.positions,
                    "select": args.select,
                    "target": args.target,
                    "accuracy": acc,
                    "relative": acc / dense_acc,
                    "achieved_ratio": result.achieved_ratio,
                    "params_after": result.params_after,
                    "prune_seconds": round(result.seconds, 2),
                    "eval_seconds": round(eval_s, 2),
                    **layer_errors(result.report),
                    "date": today(),
                    "machine": _machine(),
                }
                state["cells"][key] = row
                save_json(out_json, state)
                print(
                    f"{key}: accuracy {acc:.4f} ({acc / dense_acc:.1%} of dense), removed "
                    f"{result.achieved_ratio:.1%}, prune {result.seconds:.1f} s",
                    flush=True,
                )
    save_json(out_json, state)
    return state


def write_report(state: dict, out: Path) -> str:
    """The markdown table: one row per criterion setup and ratio, one column per reconstruction."""
    cells = list(state["cells"].values())
    methods = [m for m in ("none", "bias", "mask_tuning", "liar", "ls") if any(c["method"] == m for c in cells)]
    groups: dict[tuple, dict[str, dict]] = {}
    for c in cells:
        label = c["criterion"] + (f" {json.dumps(c['options'], sort_keys=True)}" if c["options"] else "")
        fit = FIT_LABELS[c.get("positions", "all")]
        if c.get("select", "criterion") != "criterion":
            label += f" + {c['select']} selection"
        if c.get("target", "pruned") != "pruned":
            label += " + error feedback"
        groups.setdefault((label, c["modules"], c["allocation"], fit, c["ratio"]), {})[c["method"]] = c
    dense = state["dense"]["accuracy"]
    ft = state.get("finetune", {})
    st = state["settings"]
    dates = sorted({c["date"] for c in cells}) or [today()]
    machines = sorted({c["machine"] for c in cells})
    lines = [
        "# Pruning a fine-tuned encoder: MiniLM sentiment classifier (Table 2 analogue)",
        "",
        f"Measured {dates[0]}{' to ' + dates[-1] if len(dates) > 1 else ''} on {'; '.join(machines) or _machine()}. "
        "Produced by `python bench/minilm.py`.",
        "",
        "- Model: all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads of 32, FFN 1536) fine-tuned by "
        f"`bench/finetune_minilm.py` on {ft.get('n', {}).get('train', '?')} Rotten Tomatoes review snippets "
        f"({ft.get('settings', {}).get('epochs', '?')} epochs, seed {ft.get('settings', {}).get('seed', '?')}); "
        f"dense test accuracy **{dense:.4f}** (majority class {ft.get('test_majority_baseline', float('nan')):.4f}; "
        f"fine-tuning took {ft.get('train_seconds', float('nan')):.0f} s on {ft.get('machine', '?')}).",
        f"- Calibration: {st['samples']} snippets of the train split (seed {st.get('seed', 0)}, "
        f"at most {st['max_length']} tokens, "
        f"padding excluded from the statistics), {st['holdout']} more held aside for the error report; "
        f"damping {st['damp']}.",
        f"- Evaluation: accuracy on the {st['test_examples']} test snippets (disjoint from train); each cell "
        "shows accuracy and, in brackets, accuracy relative to the dense model.",
        "- `fit on`: the token positions the reconstruction fits (`reconstruction.positions`): every real "
        "token, or only each snippet's [CLS] token, the one the classifier pools (`--positions first`).",
        "- `target` is the fraction of the transformer blocks' parameters removed; `removed` is what was "
        "achieved (bias vectors added by bias/liar/ls counted).",
        "",
        "| criterion | modules | allocation | fit on | target | removed | " + " | ".join(methods) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(methods),
    ]
    for (label, modules, allocation, fit, ratio), row in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][4], kv[0][3])
    ):
        achieved = sorted(c["achieved_ratio"] for c in row.values())
        removed = f"{achieved[0]:.1%}" + (f"–{achieved[-1]:.1%}" if achieved[-1] - achieved[0] >= 5e-4 else "")
        shown = [f"{row[m]['accuracy']:.4f} ({row[m]['relative']:.1%})" if m in row else "–" for m in methods]
        lines.append(
            f"| {label} | {modules} | {allocation} | {fit} | {ratio:.0%} | {removed} | " + " | ".join(shown) + " |"
        )
    lines += [
        "",
        "Per-layer relative output errors (mean over layers, held-aside calibration samples, before → after "
        "reconstruction) and timings are in `minilm.json`.",
        "",
    ]
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--criteria", default="magnitude", help="comma-separated criterion names (core.criteria.base)")
    p.add_argument("--ratios", default="0.3,0.5")
    p.add_argument("--methods", default=",".join(METHODS), help="reconstructions, comma-separated")
    p.add_argument("--modules", choices=["heads", "neurons", "both"], help="override every criterion's modules")
    p.add_argument("--allocation", choices=["uniform", "global"], help="override every criterion's allocation")
    p.add_argument("--criterion-options", help="JSON object merged into every criterion's options")
    p.add_argument("--samples", type=int, default=512, help="calibration snippets")
    p.add_argument("--holdout", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--damp", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="calibration sampling seed")
    p.add_argument(
        "--positions",
        choices=["all", "first", "pooled"],
        default="all",
        help="token positions the reconstruction fits (reconstruction.positions): all, or the [CLS] token only",
    )
    p.add_argument(
        "--select",
        choices=["criterion", "obs"],
        default="criterion",
        help="which units a layer drops (reconstruction.select): the criterion's (the paper), or obs",
    )
    p.add_argument(
        "--target",
        choices=["pruned", "dense"],
        default="pruned",
        help="what ls refits to (reconstruction.target): the pruned model's own outputs, or the dense model's "
        "(error feedback; ls cells only)",
    )
    p.add_argument("--test-limit", type=int, help="evaluate on the first N test snippets only (smoke runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fresh", action="store_true", help="ignore cells measured before")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    state = run(args)
    print(write_report(state, Path(args.out)))


if __name__ == "__main__":
    main()
