"""What every benchmark repeats: the results' header (date, machine, torch), the machine as the pages name
it, timing rounds with their median and spread, a measuring process set up as the ``liar`` command sets
up its own, a measurement in a process of its own, and the resumable scripts of cells (one process a
cell, the rows kept in the page's JSON). The real-model assets are ``bench/assets.py``'s; the GEMM rate a
page compares its times with is ``bench/flops.py``'s ``gemm_rate``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def today() -> str:
    return dt.date.today().isoformat()


def machine(threads: int) -> dict[str, Any]:
    """CPU model, cores, threads and library versions, for the results files."""
    import torch
    import transformers

    from bench.assets import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def stamp() -> dict[str, Any]:
    """The first keys of a results file: the date and the machine (CPU model and cores)."""
    from bench.assets import cpu_model

    return {"date": today(), "machine": f"{cpu_model()}, {os.cpu_count()} cores"}


def header() -> dict[str, Any]:
    """:func:`stamp` and torch's version."""
    import torch

    return stamp() | {"torch": torch.__version__}


def cpu_line(threads: int | None = None, suffix: str = "") -> str:
    """``x86_64, 2 cores, torch 2.13.0+cpu[, N torch threads]``: how the quality pages name their machine."""
    import torch

    line = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}{suffix}"
    return line if threads is None else f"{line}, {threads} torch threads"


def configure_as_cli() -> None:
    """The process-wide choices the ``liar`` command makes (``app/cli/common.py``): a measured run is
    what a user's run is — float32 CPU products through oneDNN where ``LIAR_CPU_MATMUL`` (default
    ``auto``) picks it on this CPU, and the allocator policy for the run's memory."""
    from app.cli.common import configure_engine

    error = configure_engine()
    if error:
        sys.exit(error)


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def median_time(fn: Callable[[], Any], warmup: int, repeats: int) -> tuple[float, list[float]]:
    """``(median seconds, every timing)`` of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def best_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """The least seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (other work only adds time)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def spread(xs: list[float], digits: int = 0) -> str:
    """``median (min–max)``, as the pages print a cell's timings."""
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})"


def span(values: list[int]) -> str:
    """``least–greatest`` of some widths, one number where they are all equal (– for none)."""
    if not values:
        return "–"
    return f"{min(values)}–{max(values)}" if min(values) != max(values) else str(values[0])


def flags(args: argparse.Namespace, *names: str) -> list[str]:
    """The options ``names`` of ``args`` as a command line gives them again (for a measuring process):
    ``--name value``, ``--name v1 v2`` for a list, ``--name`` alone for a switch that is on; none unset."""
    out = []
    for name in names:
        value, flag = getattr(args, name), f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            out += [flag] * value
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def child_result(cmd: list[str], what: str, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd``, a measurement in a fresh process that prints its row as ``RESULT {json}``: that row, or
    exit naming ``what`` with the end of the process's stderr."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        sys.exit(f"{what} failed:\n{proc.stderr[-4000:]}")
    return json.loads(line[-1][7:])


def heldout(model, tok, windows: int = 20, text: Path | None = None) -> dict:
    """``core.perplexity`` on ``windows`` windows of 512 tokens of ``text`` (default: the Wikipedia
    evaluation articles, ``bench/assets.py``): the benchmarks' held-out protocol."""
    from bench.assets import wikipedia_split
    from core import perplexity

    return perplexity(model, tok, str(text or wikipedia_split()[1]), seq_len=512, batch_size=4, max_windows=windows)


def finished_job(service, job_id: int, limit: float) -> dict:
    """A job's ``show`` once it has ended (succeeded, failed or cancelled), asked every 2 s; exit after ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        job = service.show(job_id)
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(2)
    raise SystemExit(f"job {job_id} did not finish within {limit:.0f} s")


def layer_errors(report: list) -> dict[str, float]:
    """The mean relative output errors of a prune's attention and FFN projections, before and after."""
    att = [r for r in report if r.module == "attention"]
    ffn = [r for r in report if r.module == "ffn"]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {
        "attn_err_before": mean([r.error_before for r in att]),
        "attn_err_after": mean([r.error_after for r in att]),
        "ffn_err_before": mean([r.error_before for r in ffn]),
        "ffn_err_after": mean([r.error_after for r in ffn]),
    }


def save_json(path: Path, state: dict) -> None:
    """``state`` into ``path`` through a temporary sibling, so an interrupted write leaves the last whole file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


# ---------------------------------------------------------------- resumable scripts of cells


def cell_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a resumable script of cells (kv_groups, head_ratio, unseen, obs_allocation):
    ``--threads``, ``--report-only``, and the hidden ``--one`` / ``--ratio`` of a cell's own process."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    p.add_argument("--report-only", action="store_true", help="rewrite the page from the JSON, run nothing")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ratio", type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def run_cells(
    script: str, args, one: Callable, out: Path, key: Callable[[dict], str], cells: list, write, shown
) -> None:
    """A resumable script's run. In a cell's own process (``--one``): ``one(args)``'s row as a ``RESULT``
    line. Else every ``(key, flags)`` of ``cells`` whose key the rows measured before (``out``'s JSON, by
    ``key(row)``) lack, in order, each in its own process (``script --one FLAGS``): the key and
    ``shown(row)`` printed and the page rewritten (``write(rows, args)``) after each, and at the end."""
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return
    path = out.with_suffix(".json")
    rows = {key(r): r for r in json.loads(path.read_text())["rows"]} if path.exists() else {}
    for k, flags in [] if args.report_only else cells:
        if k not in rows:
            rows[k] = child_result([sys.executable, script, "--one", *flags], f"cell {k}")
            print(k, *shown(rows[k]), flush=True)
            write(rows, args)
    write(rows, args)


def write_page(out: Path, lines: list[str], rows: dict[str, dict], machine: str) -> None:
    """A script of cells' page and the JSON of its rows."""
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": list(rows.values())}, indent=2))
