"""The block loop shared by in-memory and streamed runs: prune and reconstruct each block on the
pruned model's own inputs, following the plan (keep-sets per layer) of ``core/pipeline/planning.py``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from core.allocation import Plan
from core.allocation.plan import LayerPlan, kv_heads_of
from core.allocation.split import SplitState
from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter
from core.models.modeling_liar import ensure_bias, prune_heads_, prune_neurons_
from core.models.offload import Offload
from core.pipeline.measure import BlockSpeed, peak_memory_mb
from core.pipeline.result import LayerReport
from core.pipeline.runner import BlockRunner
from core.pipeline.scoring import hook_output_gains, split_batches
from core.spec.recipe import Recipe
from core.stats.accumulate import InputStats, OutputGain, in_residual_units
from core.stats.reconstruct import (
    reconstruct_from_stats,
    relative_output_error_from_inputs,
    relative_output_error_tensors,
)
from core.stats.select import Curve, obs_curve, obs_select
from core.stats.target import TargetStats, refit_to_dense, relative_errors_to_dense

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``; raising from it aborts the run (cooperative cancellation)."""


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


class _NoStats:
    """The sink of held-aside batches: their inputs are kept raw by the runner, not accumulated."""

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        pass


_NO_STATS = _NoStats()


@dataclass
class _Unit:
    """One pruned projection of a block: what to keep, and the surgery that removes the rest."""

    module: str  # "attention" | "ffn"
    path: str  # the projection whose input channels are pruned and which is reconstructed
    keep: torch.Tensor  # (C_in,) bool over the projection's input channels
    group: int  # channels per unit (head_dim for heads, 1 for neurons)
    shrink: Callable[[], None]  # surgery on the block
    kept: int
    total: int
    # reconstruction-aware selection: given the projection's weight and input statistics, the kept
    # units (then ``keep`` follows); None keeps the criterion's choice
    select: Callable[[torch.Tensor, InputStats], torch.Tensor] | None = None
    # error feedback: the projection's inputs in the dense model, per batch (the refit's target)
    dense_inputs: list[torch.Tensor] | None = None


class _LayerFitter:
    """Streams a projection's inputs, applies the surgery and writes the reconstructed weights."""

    def __init__(self, runner: BlockRunner, recipe: Recipe, n_fit: int, has_held: bool, device: torch.device):
        self.runner, self.n_fit, self.has_held, self.device = runner, n_fit, has_held, device
        self.stats_dtype = getattr(torch, recipe.stats_dtype)
        self.method, self.damp = recipe.reconstruction.method, recipe.reconstruction.damp
        self.reports: list[LayerReport] = []
        self._pending: list[tuple[LayerReport, list[torch.Tensor]]] = []  # errors not read back yet

    def finish(self) -> list[LayerReport]:
        """Fill in the reports' errors with one read of the device (none inside the layer loop)."""
        if self._pending:
            values = torch.stack([e.to(torch.float64) for _, errs in self._pending for e in errs]).tolist()
            for i, (report, _) in enumerate(self._pending):
                report.error_before, report.error_after = values[2 * i], values[2 * i + 1]
        self._pending = []
        return self.reports

    def recomputes(self, unit: _Unit) -> bool:
        """Whether the block's output pass recomputes ``unit``'s inputs instead of replaying kept ones
        (the FFN, with ``activations: recompute`` or host)."""
        return unit.module == "ffn" and self.runner.offload.recompute

    def stats_of(self, layer: nn.Module, path: str) -> InputStats:
        """The calibration statistics of ``layer.<path>``'s inputs (held-aside batches left out)."""
        stats = InputStats(layer.get_submodule(path).in_features, self.stats_dtype, self.device)
        self.runner.collect(layer, path, [stats] * self.n_fit + [_NO_STATS] * (len(self.runner.hidden) - self.n_fit))
        return stats

    def fit(self, layer: nn.Module, li: int, unit: _Unit, added: list[str]) -> None:
        t0 = time.perf_counter()
        lin = layer.get_submodule(unit.path)
        dense_inputs = unit.dense_inputs
        n_held = len(self.runner.hidden) - self.n_fit
        if dense_inputs is None:
            fit_stats = InputStats(lin.in_features, self.stats_dtype, self.device)
            sinks = [fit_stats] * self.n_fit + [_NO_STATS] * n_held
        else:  # error feedback: each batch's pruned inputs paired with the dense model's
            fit_stats = TargetStats(lin.in_features, self.stats_dtype, self.device, dense_gram=not self.has_held)
            fetch = self.runner.offload.fetch
            sinks = [_Paired(fit_stats, fetch, x) for x in dense_inputs[: self.n_fit]] + [_NO_STATS] * n_held
        # the replay keeps only the kept channels, unless they are chosen from the statistics below;
        # an FFN recomputed in the output pass keeps only the held-aside inputs (its error report's)
        channels = None if unit.select else unit.keep.nonzero().squeeze(1).to(self.device)
        keep_from = self.n_fit if self.recomputes(unit) else 0
        self.runner.collect(
            layer, unit.path, sinks, keep_inputs=True, keep_channels=channels, full_from=self.n_fit, keep_from=keep_from
        )
        w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
        if unit.select is not None:
            unit.keep = unit.select(w, fit_stats if dense_inputs is None else fit_stats.pruned)
            if bool(unit.keep.all()):  # the selection kept every unit (head_ratio obs): nothing to refit
                return
        keep = unit.keep.to(w.device)
        if dense_inputs is None:
            new_w, new_b, errors = self._refit(unit, w, b, keep, fit_stats)
        else:
            new_w, new_b, errors = self._refit_to_dense(unit, w, b, keep, fit_stats, dense_inputs)
        del fit_stats
        unit.shrink()
        lin = layer.get_submodule(unit.path)
        lin.weight.copy_(new_w.to(lin.weight.dtype))
        if new_b is not None:
            if lin.bias is None:
                ensure_bias(lin)
                added.append(unit.path)
            lin.bias.copy_(new_b.to(lin.bias.dtype))
        self.reports.append(
            LayerReport(
                layer=li,
                module=unit.module,
                kept=unit.kept,
                total=unit.total,
                error_before=float("nan"),  # filled in by finish()
                error_after=float("nan"),
                measured_on="held-aside" if self.has_held else "calibration",
                seconds=time.perf_counter() - t0,
                peak_memory_mb=peak_memory_mb(self.device),
            )
        )
        self._pending.append((self.reports[-1], [e.detach() for e in errors]))

    def _refit(self, unit: _Unit, w, b, keep, fit_stats: InputStats):
        """The recipe's method, and the errors before / after (on held-aside inputs when there are)."""
        # with held-aside samples the errors come from their raw inputs: the Gram may go before the solve
        new_w, new_b = reconstruct_from_stats(
            self.method, w, b, keep, fit_stats, self.damp, unit.group, release=self.has_held
        )
        naive_w, naive_b = reconstruct_from_stats("none", w, b, keep, fit_stats)
        candidates = [(naive_w, naive_b), (new_w, new_b)]
        if self.has_held:  # the held-aside samples' raw inputs are kept by collect(): no Gram for them
            errors = relative_output_error_from_inputs(
                w, b, keep, candidates, self.runner.kept_rows(unit.path, self.n_fit)
            )
        else:
            errors = relative_output_error_tensors(w, b, keep, candidates, fit_stats)
        return new_w, new_b, errors

    def _refit_to_dense(self, unit: _Unit, w, b, keep, stats: TargetStats, dense_inputs: list[torch.Tensor]):
        """Least squares onto the dense model's outputs; errors against them too."""
        new_w, new_b = refit_to_dense(w, b, keep, stats, self.damp)
        candidates = [(w[:, keep], b), (new_w, new_b)]
        if self.has_held:
            x_p = self.runner.kept_rows(unit.path, self.n_fit)
            x_d = self.runner.rows(dense_inputs[self.n_fit :], self.n_fit)
            return new_w, new_b, relative_output_error_from_inputs(w, b, keep, candidates, x_p, x_ref=x_d)
        return new_w, new_b, relative_errors_to_dense(w, b, keep, candidates, stats)


class _Paired:
    """One batch's sink of a :class:`TargetStats`: pairs the pruned inputs it is given with the
    dense model's inputs of the same batch."""

    def __init__(self, stats: TargetStats, fetch: Callable[[torch.Tensor], torch.Tensor], dense: torch.Tensor):
        self.stats, self.fetch, self.dense = stats, fetch, dense

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self.stats.add_pair(x, self.fetch(self.dense), mask)


def _keep_mask(kept: list[int], total: int, width: int = 1) -> torch.Tensor:
    keep = torch.zeros(total, dtype=torch.bool)
    keep[kept] = True
    return keep.repeat_interleave(width) if width > 1 else keep


def _shrink_heads(layer: nn.Module, fam, config, lp: LayerPlan) -> None:  # reads the plan when called:
    prune_heads_(layer, fam, config, lp.heads, lp.kv_heads)  # a reconstruction-aware selection may change it


def _shrink_neurons(layer: nn.Module, fam, lp: LayerPlan) -> None:
    prune_neurons_(layer, fam, lp.neurons)


def _select_heads(
    lp: LayerPlan, adapter: Adapter, damp: float, whole: bool, w: torch.Tensor, stats: InputStats
) -> torch.Tensor:
    """Reconstruction-aware choice of the kept query heads: as many as planned, among the heads of the
    planned key/value groups, each group keeping one at least (the parameter count is the plan's).
    ``whole``: as many whole key/value groups as planned, any of them (each costs the same)."""
    n_rep = adapter.n_rep if adapter.family.gqa else 1
    if whole and n_rep > 1:  # a group's query heads are n_rep consecutive blocks of o_proj's inputs
        lp.kv_heads = obs_select(w, stats, len(lp.kv_heads), n_rep * adapter.head_dim, damp)
        lp.heads = [g * n_rep + r for g in lp.kv_heads for r in range(n_rep)]
        return _keep_mask(lp.heads, adapter.n_heads, adapter.head_dim)
    kept_groups = set(lp.kv_heads)
    candidates = [h for h in range(adapter.n_heads) if h // n_rep in kept_groups] if n_rep > 1 else None
    groups = [h // n_rep for h in range(adapter.n_heads)] if n_rep > 1 else None
    lp.heads = obs_select(w, stats, len(lp.heads), adapter.head_dim, damp, candidates, groups)
    lp.kv_heads = kv_heads_of(lp.heads, adapter)  # with a key/value head per query head, they move together
    return _keep_mask(lp.heads, adapter.n_heads, adapter.head_dim)


def _select_split(
    lp: LayerPlan,
    li: int,
    adapter: Adapter,
    damp: float,
    split: SplitState,
    ffn: Curve,
    gain: OutputGain | None,
    w: torch.Tensor,
    stats: InputStats,
) -> torch.Tensor:
    """``head_ratio: obs``: the layer's split from the error curves of o_proj (``w``, ``stats``; its
    output norm's ``gain`` where there is one) and its FFN (``ffn``); writes it into ``lp`` and
    returns the kept heads' channel mask."""
    n_rep = adapter.n_rep if adapter.family.gqa else 1
    w = in_residual_units(w, gain)
    limit = split.head_limit(li, adapter, lp)
    if split.whole or n_rep == 1:  # units of n_rep heads (one head without GQA)
        heads = obs_curve(w, stats, limit, n_rep * adapter.head_dim, damp)
    else:
        groups = [h // n_rep for h in range(adapter.n_heads)]  # each group keeps a query head
        heads = obs_curve(w, stats, limit, adapter.head_dim, damp, groups_of=groups)
    split.apply(li, adapter, lp, heads, ffn)
    return _keep_mask(lp.heads, adapter.n_heads, adapter.head_dim)


def _select_neurons(lp: LayerPlan, damp: float, w: torch.Tensor, stats: InputStats) -> torch.Tensor:
    """Reconstruction-aware choice of the kept FFN neurons, as many as planned."""
    lp.neurons = torch.tensor(obs_select(w, stats, len(lp.neurons), 1, damp), dtype=torch.long)
    return _keep_mask(lp.neurons.tolist(), w.shape[1])


def _pruned_paths(lp: LayerPlan, adapter: Adapter) -> list[str]:
    """The projections of a block whose inputs are pruned under ``lp``."""
    fam = adapter.family
    heads, neurons = len(lp.heads) < adapter.n_heads, len(lp.neurons) < adapter.n_neurons
    return [fam.o] * heads + [fam.ffn_out] * neurons


def _prune_block(
    layer: nn.Module,
    li: int,
    lp: LayerPlan,
    adapter: Adapter,
    config,
    recipe: Recipe,
    fitter: _LayerFitter,
    runner: BlockRunner,
    dense: dict[str, list[torch.Tensor]],
    whole_groups: bool = False,
    split: SplitState | None = None,
) -> list[str]:
    """Prune and reconstruct one block's attention, then its FFN; returns the projections given a bias.
    ``dense``: the pruned projections' inputs in the dense model (error feedback), else empty;
    ``whole_groups``: the selection keeps whole key/value groups; ``split``: ``head_ratio: obs``'s
    state when this layer chooses its own split of heads and neurons, else None."""
    fam = adapter.family
    added: list[str] = []
    obs = recipe.reconstruction.resolved_select() == "obs"
    damp = recipe.reconstruction.damp
    select_heads = partial(_select_heads, lp, adapter, damp, whole_groups) if obs else None
    if split is not None:
        # the dense block's pass also measures the gains of the norms on its outputs (sandwich norms):
        # both paths' errors are then the residual stream's
        runner, n_fit = fitter.runner, fitter.n_fit
        gains, handles = hook_output_gains(
            layer, adapter, fitter.device, lambda: runner.masks[runner.batch], lambda: runner.batch < n_fit
        )
        try:
            ffn = fitter.stats_of(layer, fam.ffn_out)
        finally:
            for h in handles:
                h.remove()
        w_ffn = in_residual_units(layer.get_submodule(fam.ffn_out).weight, gains.get("ffn"))
        curve = obs_curve(w_ffn, ffn, split.neuron_limit(li, adapter, lp), 1, damp, step=split.step(li, adapter, lp))
        del ffn, w_ffn
        select_heads = partial(_select_split, lp, li, adapter, damp, split, curve, gains.get("attn"))
    if len(lp.heads) < adapter.n_heads or split is not None:
        keep = _keep_mask(lp.heads, adapter.n_heads, adapter.head_dim)
        unit = _Unit(
            "attention",
            fam.o,
            keep,
            adapter.head_dim,
            partial(_shrink_heads, layer, fam, config, lp),
            len(lp.heads),
            adapter.n_heads,
            select_heads,
            dense.get(fam.o),
        )
        fitter.fit(layer, li, unit, added)
        # later passes over this block replay the pruned attention instead of recomputing it
        runner.replay(layer, fam.attn, fam.o, unit.keep, returns_tuple=True, bypass=(fam.attn_input_norm,))
    if len(lp.neurons) < adapter.n_neurons:
        keep = _keep_mask(lp.neurons, adapter.n_neurons)
        unit = _Unit(
            "ffn",
            fam.ffn_out,
            keep,
            1,
            partial(_shrink_neurons, layer, fam, lp),
            len(lp.neurons),
            adapter.n_neurons,
            partial(_select_neurons, lp, damp) if obs else None,
            dense.get(fam.ffn_out),
        )
        # a sequential pre-norm block: the FFN pass folds the replayed attention output into the stored
        # block inputs (the residual stream entering the FFN), so the two are not kept side by side
        fold = fam.attn in runner.replays and fam.ffn_input_norm is not None
        handle = runner.absorb(layer, fam.attn, fam.ffn_input_norm) if fold else None
        try:
            fitter.fit(layer, li, unit, added)
        finally:
            if handle is not None:
                handle.remove()
        if not fitter.recomputes(unit):  # else the output pass runs the pruned FFN
            skip = (fam.ffn_input_norm, fam.ffn_inline_act)
            runner.replay(layer, fam.ffn_block, fam.ffn_out, unit.keep, returns_tuple=False, bypass=skip)
    return added


def reconstruct_blocks(
    model: nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    plan: Plan,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    device: torch.device,
    report: Progress,
    show_progress: bool,
    io: BlockIO | None = None,
    speed: BlockSpeed | None = None,
    kv_groups: str = "free",
    split: SplitState | None = None,
    offload: Offload | None = None,
) -> tuple[list[LayerReport], list[dict[str, Any]]]:
    """The block loop: prune and reconstruct each block on the pruned model's own inputs; ``speed``
    times each block before and after pruning; ``kv_groups``: the resolved ``round_to.kv_groups``;
    ``split``: ``head_ratio: obs``'s state (:func:`obs_split`), the plan's layers then change as
    they are pruned; ``offload``: where the activations are kept between uses."""
    io = io or BlockIO()
    fit, held = calibration
    bs = recipe.calibration.batch_size
    fit_batches = split_batches(fit, bs)
    batches = fit_batches + split_batches(held, bs)
    runner = BlockRunner(model, adapter, batches, device, recipe.reconstruction.positions, offload)
    if recipe.reconstruction.target == "dense":
        runner.track_dense()
    io.inputs_ready()
    fitter = _LayerFitter(runner, recipe, len(fit_batches), len(held) > 0, device)
    layers = adapter.layers(model)
    layout: list[dict[str, Any]] = []
    bar = tqdm(total=len(layers), desc=f"prune+{recipe.reconstruction.method}", unit="layer", disable=not show_progress)
    pruned = [
        i
        for i, lp in enumerate(plan.layers)
        if len(lp.heads) < adapter.n_heads or len(lp.neurons) < adapter.n_neurons or (split and split.active(i, lp))
    ]
    last_pruned = max(pruned, default=-1)
    whole = kv_groups == "whole"
    for li, layer in enumerate(layers):
        report("reconstruct", li, len(layers))
        io.load(li)
        if li == len(layers) - 1:
            runner.enter_last_block()
        if speed is not None:
            speed.time(layer, runner, "dense")
        lp = plan.layers[li]
        own_split = split is not None and split.active(li, lp)
        paths = [adapter.family.o, adapter.family.ffn_out] if own_split else _pruned_paths(lp, adapter)
        dense = runner.dense_pass(layer, paths) if runner.dense and li <= last_pruned else {}
        own = split if own_split else None
        added = _prune_block(layer, li, lp, adapter, model.config, recipe, fitter, runner, dense, whole, own)
        io.solved(li)
        if li < last_pruned:  # the next block still has something to prune: feed it
            runner.advance(layer)
        runner.restore(layer)
        if speed is not None:
            speed.time(layer, runner, "pruned")
        layout.append({"heads": lp.heads, "kv_heads": lp.kv_heads, "neurons": len(lp.neurons), "bias": added})
        io.done(li, layer)
        bar.update(1)
        if show_progress:  # reading the errors here synchronises a GPU run once per layer
            errs = [r for r in fitter.finish() if r.layer == li]
            bar.set_postfix_str(" ".join(f"{r.module[:4]} err {r.error_before:.3f}→{r.error_after:.3f}" for r in errs))
    bar.close()
    if split is not None:  # the layers chose their own splits
        plan.removed = sum(lp.removed for lp in plan.layers)
    runner.hidden, runner.extra = [], []  # free the stored activations
    report("reconstruct", len(layers), len(layers))
    return fitter.finish(), layout
