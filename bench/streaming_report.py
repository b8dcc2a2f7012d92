"""The page of ``bench/streaming.py``: streaming.md from the rows of its JSON, and the target it states."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path

from bench.random_llama import SHAPES

GB = 1e9
MB = 2**20
TARGET = (
    "CPU, TinyLlama-1.1B-shaped float32 checkpoint (≈4.4 GB), 16×128 calibration: peak RSS ≤ 1.5 GB in "
    "streaming mode, result equal to the in-memory path"
)
TARGET_RSS_MB = 1.5 * GB / MB


def machine_line() -> str:
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    line = f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, torch {torch.__version__}"
    if torch.cuda.is_available():
        line += f", {torch.cuda.get_device_name()}"
    return line


def _mb(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) and x == x else "–"


def _mode(r: dict) -> str:
    return r["mode"] + (f" ({r['child_env']})" if r.get("child_env") else "")


def fmt_row(r: dict) -> str:
    size = f"{r['checkpoint_bytes'] / GB:.2f}" if r.get("checkpoint_bytes") else "–"
    out = f"{r['output_weight_bytes'] / GB:.2f}" if r.get("output_weight_bytes") else "–"
    dev = _mb(r.get("engine_peak_mb")) if r.get("device", "cpu").startswith("cuda") else "–"
    wall = f"{r['wall_s']:.1f}" if r.get("status") == "ok" else "–"
    prune_s = f"{r['prune_s']:.1f}" if r.get("prune_s") is not None else "–"
    rss = _mb(r.get("peak_rss_mb")) if r.get("status") == "ok" else "–"
    read = f"{r['read_cold_mb_s']:,.0f} / {r['read_warm_mb_s']:,.0f}" if r.get("read_cold_mb_s") else "–"
    return (
        f"| {r['shape']} | {r['dtype']} | {r['device']} | {size} | {read} | {_mode(r)} | {r['criterion']} | "
        f"{rss} | {dev} | {wall} | {prune_s} | {out} | {r['status']} |"
    )


HEADER = (
    "| shape | dtype | device | checkpoint GB | read MB/s cold / warm | mode | criterion | peak RSS MB | "
    "peak device MB | wall s | prune s | output GB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def target_status(rows: list[dict], comparisons: dict) -> str:
    sel = lambda mode: [  # noqa: E731
        r
        for r in rows
        if r["shape"] == "1.1b"
        and r["dtype"] == "float32"
        and r["device"] == "cpu"
        and r["mode"] == mode
        and r["samples"] == 16
        and r["seq_len"] == 128
        and not r.get("child_env")
    ]
    stream = [r for r in sel("stream") if r["status"] == "ok"]
    memory = [r for r in sel("memory") if r["status"] == "ok"]
    parts = []
    if stream:
        worst = max(stream, key=lambda r: r["peak_rss_mb"])  # the target holds for every criterion or not at all
        rss = worst["peak_rss_mb"]
        verdict = "met" if rss <= TARGET_RSS_MB else "NOT met"
        parts.append(f"streaming peak RSS {rss:,.0f} MB with {worst['criterion']}, the highest of the rows ({verdict})")
        for r in rows:
            if r.get("child_env") and r["shape"] == "1.1b" and r["mode"] == "stream" and r["status"] == "ok":
                parts.append(f"with {r['child_env']}: {r['peak_rss_mb']:,.0f} MB")
    else:
        why = sel("stream")[0]["status"] if sel("stream") else "not run"
        parts.append(f"streaming not measured: {why}")
    if memory:
        parts.append(f"in-memory peak RSS {min(r['peak_rss_mb'] for r in memory):,.0f} MB")
    comp = [c for k, c in comparisons.items() if k.startswith("1.1b/")]
    if comp:
        ok = all(c["keys_equal"] and c["shapes_equal"] and c["max_abs_diff"] == 0 for c in comp)
        worst = max(c["max_abs_diff"] for c in comp)
        parts.append(f"result equal to in-memory: {'yes' if ok else 'NO'} (max |Δ| {worst:.3g})")
    else:
        parts.append("equality with the in-memory result: not compared")
    return "; ".join(parts)


def _detail_lines(all_rows: list[dict], all_comp: dict) -> list[str]:
    """The page's sections comparing the in-memory and streamed outputs, and placing the peak in time."""
    lines: list[str] = []
    if all_comp:
        lines += [
            "## In-memory vs streaming outputs",
            "",
            "| shape / criterion | tensors | keys equal | shapes equal | bitwise-equal tensors | max abs diff "
            "| worst tensor |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, c in sorted(all_comp.items()):
            lines.append(
                f"| {k} | {c['tensors']} | {c['keys_equal']} | {c['shapes_equal']} | {c['bitwise_equal_tensors']} | "
                f"{c['max_abs_diff']:.3g} | {c['worst_tensor'] or '–'} |"
            )
        lines.append("")
    sampled = [r for r in all_rows if r.get("sampled_peak_rss_mb")]
    if sampled:
        lines += [
            "## Where the peak is",
            "",
            "/proc/PID/status polled every 50 ms: the largest sampled VmRSS split into anonymous memory (heap,",
            "tensors) and file-backed pages (the mmap'ed safetensors), the second of the run it came at, and",
            "the largest of each part alone.",
            "",
            "| shape | mode | criterion | peak RSS MB (wait4) | sampled peak MB | anon MB | file MB | at s | "
            "max anon MB | max file MB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sampled:
            lines.append(
                f"| {r['shape']} | {_mode(r)} | {r['criterion']} | {_mb(r['peak_rss_mb'])} | "
                f"{_mb(r['sampled_peak_rss_mb'])} | {_mb(r['sampled_peak_anon_mb'])} | "
                f"{_mb(r['sampled_peak_file_mb'])} | {r['sampled_peak_at_s']:.0f} | {_mb(r['max_anon_mb'])} | "
                f"{_mb(r['max_file_mb'])} |"
            )
        lines.append("")
    return lines


def write_report(args, rows: list[dict], comparisons: dict, extra: dict) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_suffix(".json")
    old = {} if args.fresh or not json_path.exists() else json.loads(json_path.read_text())
    key = lambda r: (r["shape"], r["dtype"], r["device"], r["mode"], r["criterion"], r.get("child_env", ""))  # noqa: E731
    merged = {key(r): r for r in old.get("rows", [])}
    merged.update({key(r): r for r in rows})
    order = list(SHAPES)
    all_rows = sorted(merged.values(), key=lambda r: (r["device"], order.index(r["shape"]), r["criterion"], r["mode"]))
    all_comp = {**old.get("comparisons", {}), **comparisons}
    machines = {**old.get("machines", {}), dt.date.today().isoformat(): machine_line()}
    baseline = extra.get("baseline_rss_mb", old.get("baseline_rss_mb"))
    status = target_status(all_rows, all_comp)
    engines = sorted({str(r.get("engine") or f"`{r.get('engine_root')}`") for r in all_rows})
    lines = [
        "# Peak memory of pruning against model size: in-memory vs streaming",
        "",
        f"Measured {', '.join(f'{d} on {m}' for d, m in sorted(machines.items()))}. "
        "Produced by `python bench/streaming.py` (see its docstring for the options).",
        "",
        "- Checkpoints: LLaMA-shaped, random weights (normal(0, 0.02), norms 1, per-tensor seeded generators), "
        "written to disk one transformer block per safetensors shard; the project's tiny word-level tokenizer.",
        "  Shapes: 135m = SmolLM2-135M (576/1536, 30 layers, 9/3 heads, vocab 49152, tied), 1.1b = TinyLlama-1.1B "
        "(2048/5632, 22 layers, 32/4 heads, vocab 32000), 7b, 13b, 70b = LLaMA(-2) widths.",
        f"- Each run: `liar prune` in a fresh process, {args.samples} calibration windows × {args.seq_len} tokens "
        "(plus the recipe's held-aside windows) from a local text file over the tokenizer's words, "
        f"ratio {args.ratio}, reconstruction `{args.reconstruction}`, `--execution MODE` "
        "(a CLI without that flag runs in memory: `stream` is then n/a).",
        "- peak RSS: `ru_maxrss` of that child alone (`os.wait4`), including the interpreter and imports"
        + (
            f" (≈{baseline:,.0f} MB for a process that only imports torch, transformers and the engine)"
            if baseline
            else ""
        )
        + "; mmap'ed checkpoint pages count once touched. "
        "peak device MB: the engine's `torch.cuda.max_memory_allocated`.",
        "- wall s: the whole child (start, imports, load, calibration, prune, save); prune s: the engine's own time. "
        "The checkpoint's pages are evicted from the page cache before every run (`posix_fadvise`), unless `--warm`. "
        "Wall times suffer from other load on the machine; the JSON has each child's CPU seconds and the 1-minute "
        "load average at its end.",
        "- read MB/s: sequential read of the checkpoint's weight files, cold (evicted) / warm (from the page cache).",
        f"- Engine the children ran (`--engine-root`): {'; '.join(engines)}.",
        "- output GB: the pruned checkpoint's weight files.",
        "",
        f"**Target**: {TARGET}.  ",
        f"**Status**: {status}.",
        "",
        HEADER,
        *[fmt_row(r) for r in all_rows],
        "",
    ]
    lines += _detail_lines(all_rows, all_comp)
    notes = [r for r in all_rows if r.get("note")]
    if notes:
        lines += ["Notes: " + "; ".join(sorted({f"{r['shape']} {r['mode']}: {r['note']}" for r in notes})), ""]
    out.write_text("\n".join(lines))
    payload = {"machines": machines, "baseline_rss_mb": baseline, "target": TARGET, "target_status": status}
    run_args = vars(args) | {"calibration": str(args.calibration)} if rows else old.get("args")
    payload.update(args=run_args, rows=all_rows, comparisons=all_comp)
    json_path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out} and {json_path.name}")
