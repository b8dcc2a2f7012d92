"""What every benchmark repeats: the results' header (date, machine, torch), the machine as the pages name
it, timing rounds with their median and spread, and a measuring process set up as the ``liar`` command sets
up its own. The real-model assets are ``bench/assets.py``'s; the GEMM rate a page compares its times
with is ``bench/flops.py``'s ``gemm_rate``."""

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


def header() -> dict[str, Any]:
    """The first keys of a results file: the date, the machine (CPU model and cores) and torch's version."""
    import torch

    from bench.assets import cpu_model

    return {"date": today(), "machine": f"{cpu_model()}, {os.cpu_count()} cores", "torch": torch.__version__}


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


def spread(xs: list[float], digits: int = 0) -> str:
    """``median (min–max)``, as the pages print a cell's timings."""
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}–{max(xs):,.{digits}f})"
