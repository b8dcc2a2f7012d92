"""What a run measures about itself on the machine it runs on: peak memory, and each block's forward
time dense and pruned (the realised speed-up, without the whole model in memory)."""

from __future__ import annotations

import resource
import time

import torch
from torch import nn

from core.kernels.cpu_matmul import lifted
from core.pipeline.runner import BlockRunner


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (KiB on Linux)


class BlockSpeed:
    """Forward time of every block on one calibration batch, dense (as loaded) and pruned — the
    realised speed-up measured on this machine without the whole model in memory (a streamed run
    never holds it). One timed run per block and kind (the sum over blocks averages the noise), after
    one warm-up run of the first block of each kind; synchronised on GPUs. Costs about two block
    passes over one batch per block (a few percent of a run). Timed with torch's own ``nn.Linear`` forward:
    what a user's stock model runs, not the engine's CPU kernels (``core/kernels/cpu_matmul.py``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"dense": 0.0, "pruned": 0.0}
        self._warm: set[str] = set()

    def time(self, layer: nn.Module, runner: BlockRunner, which: str) -> None:
        with lifted(layer):  # the engine's route off for this block while it is timed
            self._time(layer, runner, which)

    def _time(self, layer: nn.Module, runner: BlockRunner, which: str) -> None:
        device = runner.device
        if which not in self._warm:
            runner.run(layer, 0)
            self._warm.add(which)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        runner.run(layer, 0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.seconds[which] += time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        # The speed-up is computed from the rounded times, so the three numbers a user reads agree.
        dense, pruned = round(self.seconds["dense"], 6), round(self.seconds["pruned"], 6)
        return {
            "block_seconds_dense": dense,
            "block_seconds_pruned": pruned,
            "block_speedup": round(dense / pruned, 4) if pruned > 0 else float("nan"),
        }
