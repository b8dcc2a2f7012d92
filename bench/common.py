"""What every benchmark repeats: the results' header (date, machine, torch, the GEMM rate of the same run),
timing rounds with their median and spread, and a measuring process set up as the ``liar`` command sets
up its own. The real-model assets are ``bench/assets.py``'s."""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
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


def header(threads: int, gemm: bool = True) -> dict[str, Any]:
    """A results file's header: the date, the machine and, with ``gemm``, the float32 GEMM rate measured
    now (``bench/flops.py``), so a page can state its times against what the machine computes."""
    out: dict[str, Any] = {"date": today(), "machine": machine(threads)}
    if gemm:
        import torch

        from bench.flops import gemm_rate

        out["gemm_gflops"] = gemm_rate(lambda x, w: torch.nn.functional.linear(x, w))
    return out


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


def interleaved(cells: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each cell over ``rounds`` rounds, every cell once per round in turn: a machine that slows
    down for a while slows every cell alike instead of the one timed then."""
    out: dict[str, list[float]] = {k: [] for k in cells}
    for _ in range(rounds):
        for key, fn in cells.items():
            t = time.perf_counter()
            fn()
            out[key].append(time.perf_counter() - t)
    return out


def spread(xs: list[float], digits: int = 0) -> str:
    """``median (min–max)``, as the pages print a cell's timings."""
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})"
