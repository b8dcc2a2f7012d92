"""Sweeps: one command runs a grid of pruning runs, evaluates each, and tabulates and plots the results.

The grid file and its expansion into cells are :mod:`core.spec.sweep` (the format is described
there); this module runs the cells. Each finished cell is appended at once as one JSON line to
``<out>/results.jsonl`` (:mod:`core.sweep.records`) — its metrics, summary and per-layer errors from
``PruneResult.report`` — so re-running the same command skips finished cells: an interrupted sweep
resumes, a grown grid runs only its new cells, and a cell that failed (recorded with its error) is
tried again. Changing the base recipe or the evaluation changes every cell id, so stale results are
never reused. At the end the sweep writes ``results.csv``, ``results.md`` and PNG plots from the
records of the current grid (:mod:`core.sweep.report`; ``liar sweep GRID --out DIR --report-only``
rebuilds them at any time).

Cells run in this process by default; ``isolate=True`` runs each in a fresh subprocess
(``python -m core.sweep.run CELL.json RECORD.json``) so that peak memory (and a crash) is per cell,
with its log kept in ``<out>/logs/``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.spec.evaluation import EvaluationSpec, resolve_callable
from core.spec.recipe import Recipe
from core.spec.sweep import Cell, GridError, Sweep, load_grid
from core.sweep.records import RESULTS, append_record, json_default, lock, now, read_records
from core.sweep.report import fmt, write_reports

__all__ = [
    "GridError",
    "SweepOutcome",
    "evaluate_model",
    "load_grid",
    "read_records",
    "run_cell",
    "run_sweep",
    "write_reports",
]

Log = Callable[[str], None]


def evaluate_model(model, tokenizer, spec: EvaluationSpec) -> dict[str, Any]:
    """Perplexity (if configured) and every metric callable, merged into one flat dict."""
    from core.evaluation.perplexity import perplexity

    metrics: dict[str, Any] = {}
    if spec.perplexity is not None:
        p = spec.perplexity
        ppl = perplexity(
            model, tokenizer, p.text, seq_len=p.seq_len, batch_size=p.batch_size, max_windows=p.max_windows
        )
        metrics.update(perplexity=ppl["perplexity"], nll=ppl["nll"], eval_tokens=ppl["tokens"])
    for m in spec.metrics:
        out = resolve_callable(m.callable)(model, tokenizer, **m.options)
        if not isinstance(out, dict):
            raise TypeError(f"metric callable {m.callable} returned {type(out).__name__}, not a dict")
        metrics.update(out)
    return metrics


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# Criterion scores depend on the model, the criterion and the calibration data, never on the ratio or
# the reconstruction: cells run in this process share them (a few entries; scores are small).
_SCORES: dict[str, list] = {}


def _scores_key(recipe: dict[str, Any]) -> str:
    keys = ["model", "criterion", "calibration", "dtype", "device"]
    if (recipe.get("criterion") or {}).get("name", "auto") == "auto":  # its criterion depends on the ratio
        keys += ["ratio", "allocation", "modules", "head_ratio", "reconstruction"]
    return json.dumps({k: recipe.get(k) for k in keys}, sort_keys=True)


def _prune(cell: Cell) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """Prune one cell's recipe (sharing cached criterion scores): (result, summary, per-layer rows)."""
    import core.pipeline.sequential as pipeline

    key = _scores_key(cell.recipe)
    result = pipeline.prune(Recipe.model_validate(cell.recipe), scores=_SCORES.get(key))
    if len(_SCORES) >= 4:
        _SCORES.pop(next(iter(_SCORES)))
    _SCORES[key] = result.scores
    summary = result.summary()
    layers = result.layer_rows()
    for module, short in (("attention", "attn"), ("ffn", "ffn")):
        rows = [r for r in layers if r["module"] == module]
        summary[f"{short}_error_before"] = _mean([r["error_before"] for r in rows])
        summary[f"{short}_error_after"] = _mean([r["error_after"] for r in rows])
    summary["reconstruct_seconds"] = sum(r["seconds"] for r in layers)
    return result, summary, layers


def run_cell(cell: Cell, evaluation: EvaluationSpec) -> dict[str, Any]:
    """Run one cell in this process and return its record; exceptions become a 'failed' record.

    ``KeyboardInterrupt`` (and other ``BaseException``) propagate: an interrupted cell leaves no record.
    """
    import core.models.loading as loading

    started, t0 = now(), time.perf_counter()
    record: dict[str, Any] = {"id": cell.id, "kind": cell.kind, "params": cell.params(), "recipe": cell.recipe}
    model = tokenizer = result = None
    try:
        if cell.kind == "dense":
            model, tokenizer, _ = loading.load_model(cell.model, cell.dtype, cell.device)
            n = sum(p.numel() for p in model.parameters())
            summary: dict[str, Any] = {"params_before": n, "params_after": n, "achieved_ratio": 0.0}
            layers: list[dict[str, Any]] = []
        else:
            result, summary, layers = _prune(cell)
            model, tokenizer = result.model, result.tokenizer
        t_eval = time.perf_counter()
        metrics = evaluate_model(model, tokenizer, evaluation)
        summary["eval_seconds"] = time.perf_counter() - t_eval
        record.update(status="ok", metrics=metrics, summary=summary, layers=layers, error=None)
    except Exception as exc:  # a failed cell is recorded and retried on the next run
        record.update(
            status="failed",
            metrics={},
            summary={},
            layers=[],
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(limit=20),
        )
    finally:
        del model, tokenizer, result
        _free_memory()
    record.update(started=started, finished=now(), seconds=time.perf_counter() - t0)
    return record


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _crash_record(cell: Cell, returncode: int, log_path: Path, started: str, seconds: float) -> dict[str, Any]:
    """The failed record of a cell process that exited without writing its own."""
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
    reason = f"cell process exited with code {returncode}"
    if returncode < 0:
        reason += " (killed by a signal; out of memory?)"
    return {
        "id": cell.id,
        "kind": cell.kind,
        "params": cell.params(),
        "recipe": cell.recipe,
        "status": "failed",
        "metrics": {},
        "summary": {},
        "layers": [],
        "error": reason,
        "traceback": tail,
        "started": started,
        "finished": now(),
        "seconds": seconds,
    }


def _run_isolated(cell: Cell, evaluation: EvaluationSpec, out: Path) -> dict[str, Any]:
    """Run one cell in a fresh Python process; a crash (e.g. killed for memory) becomes a failed record."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{cell.id}.log"
    with tempfile.TemporaryDirectory(prefix="liar-cell-") as tmp:
        job, rec = Path(tmp) / "cell.json", Path(tmp) / "record.json"
        job.write_text(json.dumps({"cell": cell.to_json(), "evaluation": evaluation.model_dump(mode="json")}))
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the core package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        started, t0 = now(), time.perf_counter()
        with log_path.open("w") as log:
            proc = subprocess.run(
                [sys.executable, "-m", "core.sweep.run", str(job), str(rec)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        if proc.returncode == 0 and rec.is_file():
            return json.loads(rec.read_text())
        return _crash_record(cell, proc.returncode, log_path, started, time.perf_counter() - t0)


@dataclass
class SweepOutcome:
    total: int
    skipped: int
    ran: int
    failed: int
    files: list[Path]


def _run_cells(sweep: Sweep, todo: list[Cell], out: Path, isolate: bool, log: Log) -> int:
    """Run ``todo`` in order, appending each record as it finishes; returns the number that failed."""
    evaluation = sweep.spec.evaluation
    metric = evaluation.metric
    failed = 0
    for i, cell in enumerate(todo, 1):
        log(f"[{i}/{len(todo)}] {cell.describe()} …")
        record = _run_isolated(cell, evaluation, out) if isolate else run_cell(cell, evaluation)
        append_record(out / RESULTS, record)
        if record["status"] == "ok":
            value = record["metrics"].get(metric) if metric else None
            shown = f"{metric} {fmt(value)}" if value is not None else "done"
            log(f"[{i}/{len(todo)}] {cell.describe()}: {shown} ({record['seconds']:.1f} s)")
        else:
            failed += 1
            log(f"[{i}/{len(todo)}] {cell.describe()}: FAILED: {record['error']}")
    return failed


def run_sweep(
    grid: str | Path | Sweep,
    out: str | Path,
    *,
    isolate: bool = False,
    log: Log | None = None,
) -> SweepOutcome:
    """Run every unfinished cell of ``grid`` into ``out``, then write the reports.

    Each record is appended to ``out/results.jsonl`` as soon as its cell finishes, so an interrupted
    sweep loses at most the cell that was running.
    """
    log = log or (lambda msg: print(msg, flush=True))
    sweep = grid if isinstance(grid, Sweep) else load_grid(grid)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with lock(out):
        if not isinstance(grid, Sweep):
            (out / "grid.yaml").write_text(Path(grid).read_text(encoding="utf-8"), encoding="utf-8")
        done = read_records(out / RESULTS)
        todo = [c for c in sweep.cells if done.get(c.id, {}).get("status") != "ok"]
        skipped = len(sweep.cells) - len(todo)
        retry = sum(1 for c in todo if c.id in done)
        log(
            f"{len(sweep.cells)} cells: {skipped} finished earlier, {len(todo)} to run"
            + (f" ({retry} failed before, retrying)" if retry else "")
        )
        failed = _run_cells(sweep, todo, out, isolate, log)
        files = write_reports(sweep, out)
    log(f"wrote {', '.join(str(f) for f in files)}")
    return SweepOutcome(len(sweep.cells), skipped, len(todo), failed, files)


def _child_main(job_path: str, record_path: str) -> int:
    """Entry point of an isolated cell: ``python -m core.sweep.run CELL.json RECORD.json``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    job = json.loads(Path(job_path).read_text())
    cell = Cell(**job["cell"])
    record = run_cell(cell, EvaluationSpec.model_validate(job["evaluation"]))
    Path(record_path).write_text(json.dumps(record, default=json_default))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:3]))
