"""Sweeps: a grid of pruning runs, run resumably, tabulated and plotted.

- :mod:`core.spec.sweep` — the grid file, validated and expanded into cells (torch-free).
- :mod:`core.sweep.run` — the engine: :func:`run_sweep`, :func:`run_cell`, isolated cell processes.
- :mod:`core.sweep.records` — ``results.jsonl``: reading, appending, the directory lock.
- :mod:`core.sweep.report` — ``results.csv``, ``results.md`` and the plots (:mod:`core.sweep.plots`).

The names below are imported on first use, so importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Cell": "core.spec.sweep",
    "GridError": "core.spec.sweep",
    "Sweep": "core.spec.sweep",
    "load_grid": "core.spec.sweep",
    "parse_grid": "core.spec.sweep",
    "read_records": "core.sweep.records",
    "write_reports": "core.sweep.report",
    "SweepOutcome": "core.sweep.run",
    "run_cell": "core.sweep.run",
    "run_sweep": "core.sweep.run",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'core.sweep' has no attribute {name!r}")
