"""What a run measures about itself on the machine it runs on: peak memory, and each block's forward
time dense and pruned (the realised speed-up, without the whole model in memory)."""

from __future__ import annotations

import copy
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.kernels.cpu_matmul import lifted

REPEATS = 5  # timed (dense, pruned) pairs per block: enough for a median and a spread that means something


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (KiB on Linux)


def dense_copy(block: nn.Module) -> nn.Module:
    """A copy of ``block`` taken before it is pruned, to be timed beside its pruned self: parameters
    and buffers copied (one block's memory), hooks shared rather than copied — a hook belongs to
    whoever installed it (the engine's CPU route, ``core/kernels/cpu_matmul.py``, routes the copy's
    Linears on the same exit as the model's), and copying it would copy its owner."""
    hooks = (h for m in block.modules() for d in (m._forward_pre_hooks, m._forward_hooks) for h in d.values())
    return copy.deepcopy(block, {id(h): h for h in hooks})


class BlockSpeed:
    """Forward time of every block on one calibration batch, dense (a copy taken before pruning) and
    pruned — the realised speed-up measured on this machine without the whole model in memory (a
    streamed run never holds it; the dense copy is one block, freed once timed).

    A busy worker's speed drifts: timing the dense block before pruning and the pruned one after put
    minutes of drift between the two sides, and one timing per side gave 35× and 1.07× for the same
    recipe. So the two versions are timed side by side, after one untimed warm-up of each, in
    ``repeats`` pairs that alternate which goes first — dense, pruned, pruned, dense, dense, pruned … —
    synchronised on GPUs, on the same stored inputs (a bias of going first or second, or a steady
    drift, then shows in the spread instead of moving the median). Pair r of every block adds to the
    totals ``T_dense[r]`` and ``T_pruned[r]``; each pair of totals is one sample of the speed-up,
    ``T_dense[r] / T_pruned[r]`` (drift slower than a pair cancels in the ratio). The metrics give
    their median and their spread (min and max).

    Cost: ``2 (repeats + 1)`` forwards of each block on one calibration batch (12 by default), against
    the block loop's three or more passes over every batch (16 or more at the default calibration)
    and its solves: a few percent of a run, more on a tiny model. Timed with torch's own
    ``nn.Linear`` forward: what a user's stock model runs, not the engine's CPU kernels
    (``core/kernels/cpu_matmul.py``). ``clock``: seconds, for tests."""

    def __init__(self, repeats: int = REPEATS, clock: Callable[[], float] = time.perf_counter) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, not {repeats}")
        self.repeats, self.clock = repeats, clock
        self.seconds: dict[str, list[float]] = {"dense": [0.0] * repeats, "pruned": [0.0] * repeats}

    def dense_copy(self, block: nn.Module, device: torch.device) -> nn.Module:
        """``block``'s dense copy (:func:`dense_copy`), to be timed beside it once pruned. On a GPU the
        copy waits in host memory: the run's peak device memory, at the block's solves, stays what it
        was (the copy is made there, then moved out before the solves)."""
        twin = dense_copy(block)
        return twin.to("cpu") if device.type == "cuda" else twin

    def time(
        self, dense: nn.Module, pruned: nn.Module, forward: Callable[[nn.Module], Any], device: torch.device
    ) -> None:
        """Time one block: ``forward(block)`` runs either version on the same inputs; ``dense``: its copy
        from :meth:`dense_copy`, moved to ``device`` for the timing."""
        dense = dense.to(device)
        with lifted(dense), lifted(pruned):  # the engine's route off for this block while it is timed
            self._time(dense, pruned, forward, device)

    def _time(self, dense: nn.Module, pruned: nn.Module, forward: Callable[[nn.Module], Any], device) -> None:
        sides = (("dense", dense), ("pruned", pruned))
        for _, block in sides:  # warm-up: allocations and kernel choices for this block's shapes
            forward(block)
        for r in range(self.repeats):
            for which, block in sides if r % 2 == 0 else sides[::-1]:
                self.seconds[which][r] += self._timed(forward, block, device)

    def _timed(self, forward: Callable[[nn.Module], Any], block: nn.Module, device: torch.device) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = self.clock()
        forward(block)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return self.clock() - t0

    def time_alone(self, block: nn.Module, forward: Callable[[nn.Module], Any], device: torch.device) -> list[float]:
        """``repeats`` timings of ``forward(block)`` after one untimed warm-up: a block timed without a
        pruned counterpart (before depth pruning chooses what goes; :meth:`add_depth`)."""
        with lifted(block):
            forward(block)
            return [self._timed(forward, block, device) for _ in range(self.repeats)]

    def add_depth(self, seconds: list[list[float]], removed: set[int], depth_only: bool) -> None:
        """Depth pruning's share of the totals, from every block timed dense before the span went
        (``seconds[i]``: block i's :meth:`time_alone`): a removed block counts on the dense side only
        (the pruned model does not run it); a kept block is timed again beside its pruned self by the
        width pruning, but in a ``depth_only`` run it counts here on both sides (it runs unchanged:
        the one the stand-in folds into keeps its shapes)."""
        for i, times in enumerate(seconds):
            if i not in removed and not depth_only:  # timed again beside its pruned self
                continue
            for r, t in enumerate(times):
                self.seconds["dense"][r] += t
                if i not in removed:
                    self.seconds["pruned"][r] += t

    def samples(self) -> list[float]:
        """The speed-up of each repeat over all blocks timed: ``T_dense[r] / T_pruned[r]``."""
        return [d / p for d, p in zip(self.seconds["dense"], self.seconds["pruned"]) if p > 0]

    def metrics(self) -> dict[str, float]:
        """``block_speedup``: the median sample; ``block_speedup_low`` / ``_high``: the least and the
        greatest (the spread a reader weighs the median against); ``block_speedup_repeats``: how many;
        ``block_seconds_dense`` / ``_pruned``: the median totals. The median of the ratios need not
        be the ratio of the medians: each sample pairs totals measured side by side."""
        samples = self.samples()
        nan = float("nan")
        return {
            "block_seconds_dense": round(statistics.median(self.seconds["dense"]), 6),
            "block_seconds_pruned": round(statistics.median(self.seconds["pruned"]), 6),
            "block_speedup": round(statistics.median(samples), 4) if samples else nan,
            "block_speedup_low": round(min(samples), 4) if samples else nan,
            "block_speedup_high": round(max(samples), 4) if samples else nan,
            "block_speedup_repeats": len(samples),
        }
