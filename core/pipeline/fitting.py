"""Per-projection reconstruction algorithms, in the ``add_batch → solve → free`` shape.

The block loop streams a pruned projection's calibration inputs into one of these (``add_batch``, one
fit batch at a time), lets the unit selection read its statistics (``stats``), and asks it for the
reconstructed weights of the kept input channels (``solve``), with the projection's relative output
error before and after (on the held-aside samples when there are). Which one a run uses is the
recipe's ``reconstruction.target``, looked up in :data:`RECONSTRUCTIONS` (as criteria are in
``core.criteria.REGISTRY``):

- ``pruned`` (:class:`Refit`): the recipe's method (``core.stats.reconstruct``) fits the layer to
  what it computed on the inputs it now receives (the paper's reconstruction);
- ``dense`` (:class:`RefitToDense`): error feedback, least squares onto the dense model's outputs
  (``core.stats.target``): each batch's pruned inputs are paired with the dense model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from core.pipeline.result import LayerReport
from core.pipeline.runner import BlockRunner
from core.stats.accumulate import InputStats
from core.stats.reconstruct import (
    reconstruct_from_stats,
    relative_output_error_from_inputs,
    relative_output_error_tensors,
)
from core.stats.target import TargetStats, refit_to_dense, relative_errors_to_dense


@dataclass(frozen=True, kw_only=True)
class FitData:
    """The calibration data of the block loop, as every reconstruction reads it."""

    runner: BlockRunner  # the blocks' stored inputs: batches ``[0, n_fit)`` fit, the rest are held aside
    n_fit: int
    has_held: bool
    stats_dtype: torch.dtype  # precision of the Gram products
    method: str  # ``reconstruction.method``
    damp: float


@dataclass
class Solved:
    """A projection's reconstructed weights for its kept input channels, and its relative output
    errors without and with reconstruction (0-d tensors, read once at the end: :class:`Reports`)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    errors: list[torch.Tensor]


class Reconstruction:
    """One pruned projection's reconstruction. ``dense``: its inputs in the dense model per batch
    (error feedback's target), None for a reconstruction that does not read them."""

    target: ClassVar[str]

    def __init__(self, data: FitData, path: str, width: int, dense: list[torch.Tensor] | None = None):
        self.data, self.path, self.width = data, path, width

    @property
    def stats(self) -> InputStats:
        """The statistics of the projection's inputs in the pruned model (the unit selection's)."""
        raise NotImplementedError

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def solve(self, weight: torch.Tensor, bias: torch.Tensor | None, keep: torch.Tensor, group: int) -> Solved:
        """The weights keeping input channels ``keep`` (units of ``group`` channels) of the projection
        whose (unpruned) weights are ``weight``, ``bias``."""
        raise NotImplementedError

    def free(self) -> None:
        """Drop the statistics (the largest tensors of a block's work)."""


RECONSTRUCTIONS: dict[str, type[Reconstruction]] = {}


def register(cls: type[Reconstruction]) -> type[Reconstruction]:
    RECONSTRUCTIONS[cls.target] = cls
    return cls


def reconstruction_for(target: str) -> type[Reconstruction]:
    if target not in RECONSTRUCTIONS:
        raise ValueError(f"unknown reconstruction target {target!r}; choose one of {sorted(RECONSTRUCTIONS)}")
    return RECONSTRUCTIONS[target]


@register
class Refit(Reconstruction):
    """The recipe's method on the projection's own inputs; errors against its unpruned outputs."""

    target = "pruned"

    def __init__(self, data: FitData, path: str, width: int, dense: list[torch.Tensor] | None = None):
        super().__init__(data, path, width)
        self._stats: InputStats | None = InputStats(width, data.stats_dtype, data.runner.device)

    @property
    def stats(self) -> InputStats:
        return self._stats

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self._stats.add_batch(x, mask)

    def solve(self, weight: torch.Tensor, bias: torch.Tensor | None, keep: torch.Tensor, group: int) -> Solved:
        d, stats = self.data, self._stats
        # with held-aside samples the errors come from their raw inputs: the Gram may go before the solve
        new_w, new_b = reconstruct_from_stats(d.method, weight, bias, keep, stats, d.damp, group, release=d.has_held)
        naive_w, naive_b = reconstruct_from_stats("none", weight, bias, keep, stats)
        candidates = [(naive_w, naive_b), (new_w, new_b)]
        if d.has_held:  # the held-aside samples' raw inputs are kept by collect(): no Gram for them
            rows = d.runner.kept_rows(self.path, d.n_fit)
            errors = relative_output_error_from_inputs(weight, bias, keep, candidates, rows)
        else:
            errors = relative_output_error_tensors(weight, bias, keep, candidates, stats)
        return Solved(new_w, new_b, errors)

    def free(self) -> None:
        self._stats = None


@register
class RefitToDense(Reconstruction):
    """Error feedback: least squares onto the dense model's outputs; errors against them too."""

    target = "dense"

    def __init__(self, data: FitData, path: str, width: int, dense: list[torch.Tensor] | None = None):
        super().__init__(data, path, width)
        if dense is None:
            raise ValueError(f"error feedback needs the dense model's inputs of {path}")
        self.dense = dense
        device = data.runner.device
        self._stats: TargetStats | None = TargetStats(width, data.stats_dtype, device, dense_gram=not data.has_held)
        self._fetch: Callable[[torch.Tensor], torch.Tensor] = data.runner.offload.fetch
        self._batch = 0  # the fit batches arrive in order: batch i pairs with the dense inputs ``dense[i]``

    @property
    def stats(self) -> InputStats:
        return self._stats.pruned

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self._stats.add_pair(x, self._fetch(self.dense[self._batch]), mask)
        self._batch += 1

    def solve(self, weight: torch.Tensor, bias: torch.Tensor | None, keep: torch.Tensor, group: int) -> Solved:
        d, stats = self.data, self._stats
        new_w, new_b = refit_to_dense(weight, bias, keep, stats, d.damp)
        candidates = [(weight[:, keep], bias), (new_w, new_b)]
        if d.has_held:
            x_p = d.runner.kept_rows(self.path, d.n_fit)
            x_d = d.runner.rows(self.dense[d.n_fit :], d.n_fit)
            errors = relative_output_error_from_inputs(weight, bias, keep, candidates, x_p, x_ref=x_d)
        else:
            errors = relative_errors_to_dense(weight, bias, keep, candidates, stats)
        return Solved(new_w, new_b, errors)

    def free(self) -> None:
        self._stats = None


class Reports:
    """The per-projection reports of the loop, their errors read from the device once, at the end."""

    def __init__(self) -> None:
        self.rows: list[LayerReport] = []
        self._pending: list[tuple[LayerReport, list[torch.Tensor]]] = []  # errors not read back yet

    def add(self, report: LayerReport, errors: list[torch.Tensor]) -> None:
        self.rows.append(report)
        self._pending.append((report, [e.detach() for e in errors]))

    def finish(self) -> list[LayerReport]:
        """Fill in the reports' errors with one read of the device (none inside the layer loop)."""
        if self._pending:
            values = torch.stack([e.to(torch.float64) for _, errs in self._pending for e in errs]).tolist()
            for i, (report, _) in enumerate(self._pending):
                report.error_before, report.error_after = values[2 * i], values[2 * i + 1]
        self._pending = []
        return self.rows
