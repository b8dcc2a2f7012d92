"""A sweep's reports, rebuilt from ``results.jsonl`` at the end of every run (or ``--report-only``).

- ``results.csv`` — one row per cell of the current grid (pending cells too): labels, status, every
  metric, the run summary (achieved ratio, parameters, timings, mean reconstruction errors).
- ``results.md`` — per model, a table of the chosen metric (criterion × ratio rows, one column per
  reconstruction), the failed cells and the plots.
- ``plots/*.png`` — metric vs ratio per model and criterion (:func:`core.sweep.plots.metric_vs_ratio`)
  and the per-layer errors at one ratio (:func:`core.sweep.plots.layer_errors`).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from pathlib import Path
from typing import Any

from core.spec.sweep import Cell, Sweep, slug
from core.sweep import plots
from core.sweep.records import RESULTS, read_records


def fmt(value: Any) -> str:
    """A metric value as tables and logs show it: about four significant digits, "–" for none."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def _metric_name(sweep: Sweep, records: list[dict[str, Any]]) -> str | None:
    if sweep.spec.evaluation.metric:
        return sweep.spec.evaluation.metric
    for r in records:
        if r.get("status") == "ok" and r.get("metrics"):
            return next(iter(r["metrics"]))
    return None


def write_reports(sweep: Sweep, out: str | Path) -> list[Path]:
    """results.csv, results.md and the plots, from the records of the current grid's cells."""
    out = Path(out)
    records = read_records(out / RESULTS)
    current = [records[c.id] for c in sweep.cells if c.id in records]
    metric = _metric_name(sweep, current)
    files = [_write_csv(sweep, records, out / "results.csv")]
    pngs = _write_plots(sweep, records, metric, out / "plots")
    files.append(_write_markdown(sweep, records, metric, pngs, out / "results.md"))
    return files + pngs


def _write_csv(sweep: Sweep, records: dict[str, dict[str, Any]], path: Path) -> Path:
    metric_keys: list[str] = []
    for c in sweep.cells:
        for k in records.get(c.id, {}).get("metrics", {}):
            if k not in metric_keys:
                metric_keys.append(k)
    summary_keys = [
        "achieved_ratio",
        "params_before",
        "params_after",
        "prune_seconds",
        "reconstruct_seconds",
        "eval_seconds",
        "peak_memory_mb",
        "attn_error_before",
        "attn_error_after",
        "ffn_error_before",
        "ffn_error_after",
    ]
    head = ["id", "kind", "status", "model", "criterion", "reconstruction", "ratio"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(head + metric_keys + summary_keys + ["seconds", "finished", "error"])
    for c in sweep.cells:
        rec = records.get(c.id)
        status = rec["status"] if rec else "pending"
        metrics, summary = (rec or {}).get("metrics", {}), (rec or {}).get("summary", {})
        writer.writerow(
            [c.id, c.kind, status, c.model_label, c.criterion or "", c.reconstruction or "", c.ratio or 0.0]
            + [metrics.get(k, "") for k in metric_keys]
            + [summary.get(k, "") for k in summary_keys]
            + [(rec or {}).get("seconds", ""), (rec or {}).get("finished", ""), (rec or {}).get("error") or ""]
        )
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _value(rec: dict[str, Any] | None, metric: str | None) -> str:
    if rec is None:
        return "–"
    if rec.get("status") != "ok":
        return "failed"
    return fmt(rec.get("metrics", {}).get(metric)) if metric else "–"


def _write_markdown(
    sweep: Sweep, records: dict[str, dict[str, Any]], metric: str | None, pngs: list[Path], path: Path
) -> Path:
    cells = sweep.cells
    status = [records[c.id]["status"] if c.id in records else "pending" for c in cells]
    title = sweep.spec.name or "Sweep results"
    lines = [
        f"# {title}",
        "",
        f"Written {dt.date.today().isoformat()} by `liar sweep`"
        + (f" from `{sweep.source}`" if sweep.source else "")
        + f"; {status.count('ok')} of {len(cells)} cells finished, {status.count('failed')} failed, "
        f"{status.count('pending')} pending. Metric: **{metric or '–'}**. Ratio: the fraction of the "
        "transformer blocks' parameters to remove (target; `results.csv` has the achieved one).",
        "",
    ]
    for model in sweep.models:
        lines += [f"## {model}", "", "| criterion | ratio | " + " | ".join(sweep.methods) + " |"]
        lines.append("|---|---|" + "---|" * len(sweep.methods))
        dense = next((c for c in cells if c.kind == "dense" and c.model_label == model), None)
        if dense is not None:
            blanks = [""] * (len(sweep.methods) - 1)
            lines.append("| dense | 0% | " + " | ".join([_value(records.get(dense.id), metric)] + blanks) + " |")
        for crit in sweep.criteria:
            for ratio in sweep.ratios:
                row = []
                for method in sweep.methods:
                    cell = next(
                        c
                        for c in sweep.prune_cells
                        if (c.model_label, c.criterion, c.reconstruction, c.ratio) == (model, crit, method, ratio)
                    )
                    row.append(_value(records.get(cell.id), metric))
                lines.append(f"| {crit} | {ratio:.0%} | " + " | ".join(row) + " |")
        lines.append("")
    failures = [(c, records[c.id]) for c in cells if c.id in records and records[c.id]["status"] != "ok"]
    if failures:
        lines += ["## Failed cells (retried on the next run)", ""]
        lines += [f"- {c.describe()}: `{(r.get('error') or '').splitlines()[0][:300]}`" for c, r in failures]
        lines.append("")
    if pngs:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in pngs]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _write_plots(sweep: Sweep, records: dict[str, dict[str, Any]], metric: str | None, folder: Path) -> list[Path]:
    files: list[Path] = []
    ok = {c.id: records[c.id] for c in sweep.cells if c.id in records and records[c.id]["status"] == "ok"}
    error_ratio = sweep.spec.plots.error_ratio if sweep.spec.plots.error_ratio is not None else max(sweep.ratios)
    for model in sweep.models:
        dense = next((c for c in sweep.cells if c.kind == "dense" and c.model_label == model and c.id in ok), None)
        dense_value = ok[dense.id]["metrics"].get(metric) if dense is not None and metric else None
        for crit in sweep.criteria:
            cells = [c for c in sweep.prune_cells if c.model_label == model and c.criterion == crit and c.id in ok]
            if not cells:
                continue
            stem = f"{slug(model)}-{slug(crit)}"
            if metric and any(metric in ok[c.id]["metrics"] for c in cells):
                series = {
                    m: [(c.ratio, ok[c.id]["metrics"].get(metric)) for c in cells if c.reconstruction == m]
                    for m in sweep.methods
                }
                files.append(
                    plots.metric_vs_ratio(
                        {k: v for k, v in series.items() if v},
                        folder / f"{metric}-vs-ratio-{stem}.png",
                        metric=metric,
                        title=f"{model}, {crit} criterion",
                        dense=dense_value,
                        log_y=sweep.spec.evaluation.log_scale,
                    )
                )
            at_ratio = [c for c in cells if c.ratio == error_ratio and ok[c.id].get("layers")]
            if at_ratio:
                files.append(
                    plots.layer_errors(
                        _error_series(at_ratio, ok),
                        folder / f"layer-errors-{stem}-r{error_ratio:g}.png",
                        title=f"{model}, {crit} criterion, {error_ratio:.0%} removed: per-layer output error",
                    )
                )
    return files


def _error_series(cells: list[Cell], ok: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """error_after per reconstruction, plus the plain-pruning error (the 'none' run, else error_before)."""

    def per_module(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            out.setdefault(r["module"], []).append((r["layer"], r[key]))
        return out

    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    plain = next((c for c in cells if (c.recipe or {}).get("reconstruction", {}).get("method") == "none"), None)
    source = plain or cells[0]
    label = "no reconstruction" if plain else f"no reconstruction (error_before of the {source.reconstruction} run)"
    series[label] = per_module(ok[source.id]["layers"], "error_after" if plain else "error_before")
    for c in cells:
        if c is not plain:
            series[c.reconstruction or "?"] = per_module(ok[c.id]["layers"], "error_after")
    return series
