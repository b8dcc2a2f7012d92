"""The markdown report of ``bench/peers.py``: ``docs/results/peers.md`` from ``peers.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.pages.values import ppl

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct", "perplexity"),
    "minilm": ("MiniLM-L6 sentiment classifier", "accuracy"),
}
TOOL_ORDER = {"ours": 0, "torch-pruning": 1, "modelopt": 2}


def _machine() -> str:
    from bench.assets import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores, Linux, no GPU; 2 torch threads per process"


def _versions(state: dict) -> list[str]:
    seen: dict[str, set[str]] = {}
    for row in [*state["cells"].values(), *state["dense"].values()]:
        for name, ver in (row.get("env") or {}).items():
            seen.setdefault(name, set()).add(ver)
    return [f"{name} {', '.join(sorted(vs))}" for name, vs in sorted(seen.items())]


def _dense_lines(state: dict) -> list[str]:
    lines = ["| model | environment | dense perplexity | dense accuracy |", "|---|---|---|---|"]
    for env_key, d in sorted(state["dense"].items()):
        model, tool = env_key.split("|")
        ppl, acc = d.get("perplexity"), d.get("accuracy")
        lines.append(
            f"| {MODELS[model][0]} | {tool} | {'–' if ppl is None else f'{ppl:.6f}'} | "
            f"{'–' if acc is None else f'{acc:.6f}'} |"
        )
    return lines


def _knobs(row: dict) -> str:
    k = dict(row.get("knobs") or {})
    if row["tool"] == "ours":
        r = k.get("recipe", {})
        rec = r.get("reconstruction", {})
        rt = r.get("round_to", {})
        return (
            f"{r.get('criterion', {}).get('name')}, {r.get('allocation')}, {rec.get('method')}, "
            f"select {rec.get('select')}, positions {rec.get('positions')}, neurons round "
            f"{k.get('round_to_neurons') or rt.get('neurons')}"
        )
    if row["tool"] == "torch-pruning":
        heads = k.get("query_heads_kept") or []
        head_txt = f"heads/layer {min(heads)}–{max(heads)}" if heads else ""
        return (
            f"pruning_ratio {k.get('pruning_ratio')}, head_pruning_ratio {k.get('head_pruning_ratio')}, "
            f"global {k.get('global_pruning')}, {head_txt}, hidden {k.get('hidden_size')}"
        )
    if row["tool"] == "modelopt":
        reused = " (sensitivity map reused)" if k.get("sensitivity_map_reused") else ""
        return f"params ≤ {k.get('constraints', {}).get('params', 0):,}; score: {k.get('score_func')}{reused}"
    return ""


def _error(row: dict) -> str:
    err = row["error"].strip().splitlines()[-1] if row["error"].strip() else row["error"]
    return err.replace("|", "\\|")[:400]


def _row_line(row: dict, metric: str, ref: dict | None, dense: dict | None) -> str:
    label = row.get("label", row["variant"])
    if "error" in row:
        return f"| {label} | could not prune: `{_error(row)}` | – | – | – | – | – | – | – |"
    removed = f"{row['removed']:.1%} ({row['removed_total']:.1%})"
    speed = f"{row['prefill_tokens_s']:.0f} ({row['speedup']:.2f}×)"
    rss = f"{row['peak_rss_mb'] / 1024:.2f} GB"
    if metric == "perplexity":
        q = ppl(row["perplexity"])
        rel = "–" if not ref or "error" in ref else f"{row['perplexity'] / ref['perplexity']:.2f}×"
    else:
        dacc = (dense or {}).get("accuracy")
        q = f"{row['accuracy']:.4f}" + (f" ({row['accuracy'] / dacc:.1%})" if dacc else "")
        rel = "–" if not ref or "error" in ref else f"{100 * (row['accuracy'] - ref['accuracy']):+.1f} pt"
    return f"| {label} | {_knobs(row)} | {removed} | {q} | {rel} | {row['prune_seconds']:.0f} s | {rss} | {speed} |"


def _table(state: dict, model: str, ratio: float) -> list[str]:
    rows = [r for r in state["cells"].values() if r["model"] == model and r["ratio"] == ratio]
    if not rows:
        return []
    rows.sort(key=lambda r: (TOOL_ORDER.get(r["tool"], 9), r["variant"]))
    name, metric = MODELS[model]
    ref = next((r for r in rows if r["tool"] == "ours" and r["variant"] == "default"), None)
    dense = state["dense"].get(f"{model}|ours")
    q_head = "held-out perplexity" if metric == "perplexity" else "test accuracy (of dense)"
    rel_head = "ppl ÷ our default" if metric == "perplexity" else "vs our default"
    lines = [
        f"### {name}, {ratio:.0%} of block parameters",
        "",
        f"| tool / recipe | knobs | removed: blocks (all) | {q_head} | {rel_head} | prune | peak RSS | "
        "prefill tok/s (× dense) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return lines + [_row_line(r, metric, ref, dense) for r in rows] + [""]


def write_report(state: dict, out: Path, pending: list[str] | None = None) -> str:
    dates = sorted({r.get("date", "") for r in state["cells"].values()} - {""})
    lines = [
        "# Side by side with Torch-Pruning and NVIDIA ModelOpt",
        "",
        f"Measured {dates[0] if dates else '–'}{' to ' + dates[-1] if len(dates) > 1 else ''} on {_machine()}. "
        "Produced by `make bench-peers` (`python bench/peers.py`, resumable; cells in `peers.json`).",
        "",
        "Versions: " + "; ".join(_versions(state)) + ".",
        "",
    ]
    lines += ["", "", "## Dense models in every environment", "", *_dense_lines(state), "", "## Results", ""]
    for model in MODELS:
        for ratio in sorted({r["ratio"] for r in state["cells"].values() if r["model"] == model}):
            lines += _table(state, model, ratio)
    if pending:
        lines += [
            "## Not measured yet",
            "",
            "Cells of the benchmark without a result (run `make bench-peers` to add them):",
            "",
        ]
        lines += [f"- `{k}`" for k in pending] + [""]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


if __name__ == "__main__":
    import sys

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs/results/peers.md"
    print(write_report(json.loads(path.with_suffix(".json").read_text()), path))
