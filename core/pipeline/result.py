"""What a pruning run returns: the pruned model in memory, its plan and a per-layer report."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from core.allocation import Plan
from core.criteria import Scores
from core.models.adapter import Adapter
from core.spec.recipe import Recipe


@dataclass
class LayerReport:
    layer: int
    module: str  # "attention" | "ffn"
    kept: int  # heads or neurons kept
    total: int
    error_before: float  # relative output error of the projection, pruned without reconstruction
    error_after: float  # ... after reconstruction
    measured_on: str  # "held-aside" calibration samples, or the fit samples when none are held aside
    seconds: float
    peak_memory_mb: float


@dataclass
class PruneResult:
    model: nn.Module | None  # None after a streamed run: the pruned weights are in ``checkpoint``
    tokenizer: Any
    recipe: Recipe
    adapter: Adapter
    plan: Plan  # what the run realised: each layer's kept units (the pruned model's widths)
    report: list[LayerReport]
    params_before: int
    params_after: int
    block_params_before: int
    block_params_after: int
    seconds: float
    peak_memory_mb: float
    metrics: dict[str, Any] = field(default_factory=dict)
    scores: list[Scores] = field(default_factory=list, repr=False)  # the criterion's scores (reusable)
    # the plan the allocation made, before the block loop chose units from the calibration statistics
    # (``reconstruction.select: obs``) or each layer its split (``head_ratio: obs``); None when not kept
    planned: Plan | None = field(default=None, repr=False)
    # a streamed run's checkpoint, written but not yet finished by :meth:`save` (no metrics, card or
    # SHA256SUMS yet), whether it is in stock form, and the digests of the shards written
    checkpoint: Path | None = None
    stock: bool = False
    digests: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def achieved_ratio(self) -> float:
        """Fraction of the transformer blocks' parameters removed (added biases counted)."""
        return 1.0 - self.block_params_after / self.block_params_before

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.recipe.model,
            "target_ratio": self.recipe.ratio,
            "achieved_ratio": round(self.achieved_ratio, 6),
            "ratio_deviation": round(self.achieved_ratio - self.recipe.ratio, 6),
            "params_before": self.params_before,
            "params_after": self.params_after,
            "block_params_before": self.block_params_before,
            "block_params_after": self.block_params_after,
            "prune_seconds": round(self.seconds, 3),
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            **self.metrics,
        }

    def layer_rows(self) -> list[dict[str, Any]]:
        """The per-layer report as plain dicts (``metrics.json``, job metrics, sweep records)."""
        return [asdict(r) for r in self.report]

    @property
    def streamed(self) -> bool:
        return self.model is None

    def save(self, output_dir: str | Path, overwrite: bool = False) -> Path:
        """Write the checkpoint to ``output_dir``; after a streamed run, finish the one it wrote
        (metrics, model card, ``SHA256SUMS``) and move it there."""
        from core.models.export import check_output_dir, finish_checkpoint, save_pruned

        if not self.streamed:
            return save_pruned(self, output_dir, overwrite=overwrite)
        if self.checkpoint is None or not self.checkpoint.is_dir():
            raise FileNotFoundError("this streamed result's checkpoint was already saved or discarded")
        out = check_output_dir(output_dir, overwrite)
        done = finish_checkpoint(self, self.checkpoint, out, self.stock, self.digests)
        self.checkpoint = None
        return done

    def discard(self) -> None:
        """Remove a streamed run's unfinished checkpoint (after a failure between prune and save)."""
        if self.checkpoint is not None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            self.checkpoint = None
