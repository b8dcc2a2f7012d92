"""What a pruning run passes down: the caller's options, the run's fixed context, and the interface
of the two model sources (the whole model in memory, or one streamed block at a time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from core.criteria import Scores
from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter
from core.models.offload import Offload
from core.pipeline.measure import BlockSpeed
from core.pipeline.result import PruneResult
from core.spec.recipe import Recipe

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``; raising from it aborts the run (cooperative cancellation)."""


def no_progress(stage: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How :func:`core.prune` is fed and reports, beside the recipe (what is pruned) and the model's
    source (``model``, ``tokenizer``, ``output_dir``, ``overwrite``)."""

    # pre-tokenised ``(fit, held_aside)`` batches, instead of the recipe's calibration source
    calibration: tuple[CalibrationBatch, CalibrationBatch] | None = None
    # the ``PruneResult.scores`` of an earlier run of the same model and criterion (skips scoring)
    scores: list[Scores] | None = None
    progress: Progress | None = None  # called at every stage and after every block
    show_progress: bool = False  # a progress bar on the terminal
    measure_speed: bool = False  # time every block before and after pruning
    # where block-boundary checkpoints are kept, and resumed from (core/pipeline/checkpoint.py)
    checkpoints: Any = None

    def __post_init__(self) -> None:
        cal = self.calibration
        if cal is not None and not (isinstance(cal, tuple) and len(cal) == 2):
            raise TypeError("calibration must be a (fit, held_aside) pair of calibration batches")
        if self.scores is not None and not isinstance(self.scores, list):
            raise TypeError("scores must be the list of an earlier result's scores, one per layer")
        if self.checkpoints is not None and not all(
            hasattr(self.checkpoints, m) for m in ("save", "load", "peek", "discard", "stop_requested", "note")
        ):
            raise TypeError("checkpoints must implement core.pipeline.checkpoint.Checkpoints")
        if self.progress is not None and not callable(self.progress):
            raise TypeError("progress must be a callable progress(stage, done, total)")
        for name in ("show_progress", "measure_speed"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, not {getattr(self, name)!r}")

    @classmethod
    def of(cls, options: dict[str, Any]) -> RunOptions:
        """The options given to :func:`core.prune` as keywords; an unknown one is refused."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(
                f"prune() got unexpected keyword argument(s) {', '.join(unknown)}; it takes model, tokenizer, "
                f"output_dir, overwrite and {', '.join(known)}"
            )
        return cls(**options)

    @property
    def report(self) -> Progress:
        return self.progress or no_progress


class BlockIO:
    """Where blocks come from and go to. In memory: nowhere (every block is already on the device);
    a streamed run reads each block from the checkpoint before and writes and frees it after."""

    def inputs_ready(self) -> None:
        """Called once the first block's inputs are computed."""

    def load(self, index: int) -> None:
        pass

    def solved(self, index: int) -> None:
        """Called once block ``index``'s solves are done (its pruned forward passes are still to come)."""

    def done(self, index: int, layer: nn.Module) -> None:
        pass

    def block_files(self, upto: int) -> tuple[dict[str, tuple[Path, str]], dict[str, Any]] | None:
        """For a checkpoint: the files that hold blocks ``0 .. upto - 1`` as written (name → (path,
        sha256)) and what the manifest needs to restore them; None where the blocks are in memory
        (the checkpoint saves their weights)."""
        return None

    def restore_blocks(self, files: dict[str, Path], manifest: dict[str, Any]) -> None:
        """Put back the files :meth:`block_files` named for a checkpoint (a resumed streamed run)."""


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What the block loop reads and nothing changes once it starts: the model, the resolved recipe
    and the choices this run made for its device."""

    model: nn.Module
    adapter: Adapter
    recipe: Recipe  # criterion, allocation and select's auto resolved
    device: torch.device
    offload: Offload  # where the calibration activations are kept between uses
    io: BlockIO  # where blocks come from and go to
    kv_groups: str = "free"  # the resolved ``round_to.kv_groups``
    report: Progress = no_progress
    show_progress: bool = False
    speed: BlockSpeed | None = None  # times each block before and after pruning
    checkpoints: Any = None  # core.pipeline.checkpoint.Checkpoints: saved at block boundaries, resumed from
    scores: Any = None  # core.pipeline.resume.RunScores: the plan's scores, kept with the checkpoints


class ModelSource(Protocol):
    """Where a run's model comes from and where the pruned one goes: the whole model in memory
    (``sequential.MemorySource``) or a checkpoint streamed block by block (``streamed.StreamSource``)."""

    model: nn.Module
    tokenizer: Any
    adapter: Adapter
    device: torch.device

    @property
    def io(self) -> BlockIO:
        """How the block loop brings each block in and out."""

    @property
    def reuses_memory(self) -> bool:
        """Whether the run may reuse freed host memory (``core/models/host_memory.py``)."""

    def score(
        self, recipe: Recipe, batches: list[CalibrationBatch], progress: Callable[[int], None] | None, offload: Offload
    ) -> list[Scores]:
        """Every layer's criterion scores on the dense model."""

    def remove_depth(
        self,
        recipe: Recipe,
        calibration: tuple[CalibrationBatch, CalibrationBatch],
        report: Progress,
        speed: BlockSpeed | None = None,
    ) -> dict[str, Any]:
        """Remove the recipe's span of whole blocks (chosen on the ``(fit, held-aside)`` windows) before
        the width pruning; ``adapter`` becomes the shorter model's; ``speed`` gets the dense blocks'
        times (``BlockSpeed.add_depth``). Returns the run's depth metrics."""

    def finish(self, result: PruneResult, report: Progress) -> PruneResult:
        """The result once the pruned model is where it goes (a streamed run writes its checkpoint)."""

    def abort(self) -> None:
        """Undo what a failed run left (a streamed run's partial checkpoint)."""
