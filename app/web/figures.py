"""How the web app words a job's numbers: a speed-up with its spread, or why it has none worth reading,
and a human name for every metric key a job records.

A speed-up is timed on a worker that may be busy: the job records the median of several timings and
their spread (``<key>_low`` / ``<key>_high``, ``core/pipeline/measure.py``, ``core/evaluation/speed.py``).
A figure whose spread is wider than its effect is noise, and is shown as such (:func:`measurable`),
never as a number like 35×; older jobs timed once have no spread and are shown as a single timing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

NOT_MEASURABLE = "not measurable on this worker"
SINGLE_TIMING = "single timing: not measurable"
# the speed-ups a job may record (each with <key>_low, <key>_high and <key>_repeats), and what they time
SPEEDUPS = {"realised_speedup": "target workload", "prefill_speedup": "prefill", "block_speedup": "blocks"}
SPREAD = ("_low", "_high", "_repeats")

# metric key → what a reader calls it; a key not here is named by :func:`metric_name`'s fallback
METRIC_NAMES = {
    "perplexity": "perplexity, pruned",
    "perplexity_dense": "perplexity, dense",
    "eval_tokens": "tokens evaluated",
    "tasks_acc_mean": "mean accuracy over the tasks",
    "evaluations_failed": "evaluations failed",
    "target_ratio": "ratio asked (fraction of block parameters)",
    "achieved_ratio": "parameters removed (fraction of block parameters)",
    "ratio_deviation": "removed − asked",
    "params_before": "parameters, dense",
    "params_after": "parameters, pruned",
    "block_params_before": "block parameters, dense",
    "block_params_after": "block parameters, pruned",
    "kept_heads_mean": "attention heads kept per block (mean)",
    "kept_neurons_mean": "FFN neurons kept per block (mean)",
    "kv_index_layers": "blocks gathering key/value heads by index",
    "round_to_heads": "heads rounded to a multiple of",
    "round_to_neurons": "FFN neurons rounded to a multiple of",
    "prune_seconds": "pruning time (s)",
    "peak_memory_mb": "peak memory (MiB)",
    "block_seconds_dense": "block time, dense (s)",
    "block_seconds_pruned": "block time, pruned (s)",
    "block_speedup": "speed-up, blocks",
    "prefill_tok_s_dense": "prefill, dense (tokens/s)",
    "prefill_tok_s": "prefill, pruned (tokens/s)",
    "prefill_speedup": "speed-up, prefill",
    "target_speedup": "speed-up asked",
    "predicted_speedup": "speed-up predicted (latency table)",
    "realised_speedup": "speed-up, target workload",
    "heldout_loss": "held-aside loss",
    "width_ratio": "width ratio (after removing blocks)",
    "depth_blocks_removed": "blocks removed",
    "depth_layers_before": "blocks, dense",
    "depth_seconds": "block selection time (s)",
    "export_written": "serving files written",
    "export_failed": "serving files failed",
    "export_bytes": "exported files (bytes)",
    "export_eval_windows": "windows each file was scored on",
    "export_eval_windows_total": "windows of the job's evaluation",
    "export_eval_seq_len": "tokens per window",
    "export_reference_perplexity": "perplexity of the checkpoint itself, same windows",
    "export_reference_bytes": "the checkpoint's weights (bytes)",
    "cpu_matmul_onednn_gflops": "CPU products, oneDNN (GFLOP/s)",
    "cpu_matmul_blas_gflops": "CPU products, BLAS (GFLOP/s)",
}

# the fields of an export job's row per form, ``export.<form>.<field>`` (jobs.export_quality)
EXPORT_FIELDS = {
    "bytes": "file bytes",
    "perplexity": "held-out perplexity (llama.cpp)",
    "fallbacks": "tensors fallen back from its K/i type",
}


def measurable(median: float | None, low: float | None, high: float | None) -> bool:
    """Whether a speed-up stands out of its own noise: False when its interval ``[low, high]``
    contains 1.0 (no speed-up and a slow-down are both in it), when the interval is wider than the
    effect (``high − low > |median − 1|``), or when a number is missing or not finite."""
    values = (median, low, high)
    if any(v is None or not math.isfinite(v) for v in values):
        return False
    if low <= 1.0 <= high:
        return False
    return high - low <= abs(median - 1.0)


def speedup_of(metrics: Mapping[str, Any], key: str) -> tuple[float | None, float | None, float | None]:
    """``(median, low, high)`` of the speed-up ``key`` a job recorded (None where it did not)."""
    return metrics.get(key), metrics.get(key + "_low"), metrics.get(key + "_high")


def speedup_text(median: float | None, low: float | None = None, high: float | None = None) -> str:
    """``1.31× (1.25–1.36)``; a figure without a spread (an older job's single timing) or one that
    does not stand out of it says so instead of giving a number."""
    if median is None:
        return "–"
    if low is None or high is None:
        return SINGLE_TIMING
    if not measurable(median, low, high):
        return NOT_MEASURABLE
    return f"{median:.2f}× ({low:.2f}–{high:.2f})"


def metric_name(key: str, metrics: Mapping[str, Any] | None = None) -> str:
    """What a reader calls metric ``key``: a speed-up names how many timings its median is of (from
    ``metrics``); an unknown key reads as words (``piqa.acc_norm`` → ``piqa acc norm``)."""
    form, _, field = key.removeprefix("export.").rpartition(".")
    if key.startswith("export.") and field in EXPORT_FIELDS:  # an export's row (jobs.export_quality)
        return f"{form}: {EXPORT_FIELDS[field]}"
    name = METRIC_NAMES.get(key) or key.replace("_", " ").replace(".", " ")
    repeats = (metrics or {}).get(key + "_repeats") if key in SPEEDUPS else None
    return f"{name} (median of {int(repeats)})" if repeats else name


def _value_text(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1000 else f"{value:.6g}"


def metric_rows(metrics: Mapping[str, Any], first: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(name, value)`` per metric, those in ``first`` first (in that order), the others sorted; a
    speed-up's spread is read into its own line (:func:`speedup_text`), not listed apart."""
    first = [k for k in first if k in metrics]
    keys = first + sorted(k for k in metrics if k not in first)
    spread = {k + s for k in SPEEDUPS if k in metrics for s in SPREAD}
    return [
        (metric_name(k, metrics), speedup_text(*speedup_of(metrics, k)) if k in SPEEDUPS else _value_text(metrics[k]))
        for k in keys
        if k not in spread
    ]


def metrics_markdown(metrics: Mapping[str, Any], first: Iterable[str] = ()) -> str:
    """The metrics as a two-column Markdown table (:func:`metric_rows`); empty if there are none."""
    rows = metric_rows(metrics, first)
    if not rows:
        return ""
    return "| metric | value |\n|---|---:|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)
