"""The block loop shared by in-memory and streamed runs: prune and reconstruct each block on the
pruned model's own inputs, following the plan (keep-sets per layer) of ``core/pipeline/planning.py``.

Each pruned projection of a block (the attention's output projection, then the FFN's) goes through
the same five steps:

    collect  stream its calibration inputs into the reconstruction (``core/pipeline/fitting.py``)
    choose   the kept units, by the run's strategy (``core/pipeline/choosing.py``): a new layer plan
    cut      remove the other units from the block (surgery)
    solve    the reconstructed weights of the kept input channels
    write    them into the cut projection

The plan the loop is given is never changed: what each block really kept is returned beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from core.allocation import Plan
from core.allocation.plan import LayerPlan
from core.allocation.split import SplitState
from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter
from core.models.modeling_liar import ensure_bias, prune_heads_, prune_neurons_
from core.pipeline.choosing import ByCriterion, ByObs, ObsSplit, Strategy
from core.pipeline.context import RunContext
from core.pipeline.fitting import FitData, Reconstruction, Reports, Solved, reconstruction_for
from core.pipeline.measure import peak_memory_mb
from core.pipeline.result import LayerReport
from core.pipeline.resume import Checkpointer, fingerprint
from core.pipeline.runner import BlockRunner, KeptInputs
from core.pipeline.scoring import hook_output_gains, split_batches
from core.stats.accumulate import InputStats, in_residual_units
from core.stats.select import obs_curve

ATTENTION, FFN = "attention", "ffn"  # the two pruned parts of a block (their reports' ``module``)


@dataclass
class Reconstructed:
    """What the block loop returns: the plan it realised (each block's kept units), one report per
    pruned projection, and the pruned model's layout (``config.liar_layout``)."""

    plan: Plan
    reports: list[LayerReport]
    layout: list[dict[str, Any]]
    checkpoints: dict[str, Any] = field(default_factory=dict)  # saves made, and where the loop resumed


@dataclass(frozen=True, kw_only=True)
class _Loop:
    """The loop's fixed parts: the run's context, the calibration data, and the strategies."""

    run: RunContext
    data: FitData
    reports: Reports
    rebuild: type[Reconstruction]  # the recipe's reconstruction.target
    select: ByCriterion | ByObs  # reconstruction.select
    split: SplitState | None  # head_ratio obs's running state, else None


@dataclass
class _Block:
    layer: nn.Module
    index: int
    dense: dict[str, list[torch.Tensor]]  # its pruned projections' inputs in the dense model (error feedback)
    added: list[str] = field(default_factory=list)  # projections given a bias


class _NoStats:
    """The sink of held-aside batches: their inputs are kept raw by the runner, not accumulated."""

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        pass


_NO_STATS = _NoStats()


def reconstruct_blocks(
    ctx: RunContext,
    plan: Plan,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    split: SplitState | None = None,
) -> Reconstructed:
    """The block loop: prune and reconstruct each block on the pruned model's own inputs as ``plan``
    says (``plan`` itself is left as it is); ``split``: ``head_ratio: obs``'s state
    (:func:`~core.pipeline.planning.obs_split`), when the layers choose their own splits."""
    loop = _start(ctx, calibration, split)
    runner, layers = loop.data.runner, ctx.adapter.layers(ctx.model)
    last_pruned = max((i for i, lp in enumerate(plan.layers) if _prunes(loop, i, lp)), default=-1)
    saver = None
    if ctx.checkpoints is not None:
        saver = Checkpointer(ctx, ctx.checkpoints, fingerprint(ctx, plan, calibration), len(layers))
    try:
        done = _loop_blocks(loop, plan, saver, last_pruned)
    finally:
        if saver is not None:
            saver.close()
    runner.hidden, runner.extra = [], []  # free the stored activations
    ctx.report("reconstruct", len(layers), len(layers))
    return done


def _loop_blocks(loop: _Loop, plan: Plan, saver: Checkpointer | None, last_pruned: int) -> Reconstructed:
    """Blocks from the first one not in the checkpoint (``saver``'s, if any) to the last."""
    ctx, split = loop.run, loop.split
    runner, layers = loop.data.runner, ctx.adapter.layers(ctx.model)
    start, realised, layout = saver.resume(runner, split, loop.reports) if saver else (0, [], [])
    desc = f"prune+{ctx.recipe.reconstruction.method}"
    bar = tqdm(total=len(layers), initial=start, desc=desc, unit="layer", disable=not ctx.show_progress)
    for li, layer in enumerate(layers):
        if li < start:  # kept from the checkpoint
            continue
        ctx.report("reconstruct", li, len(layers))
        ctx.io.load(li)
        if li == len(layers) - 1:
            runner.enter_last_block()
        before = ctx.speed.dense_copy(layer, runner.device) if ctx.speed is not None else None
        planned = plan.layers[li]
        dense = runner.dense_pass(layer, _pruned_paths(loop, li, planned)) if runner.dense and li <= last_pruned else {}
        block = _Block(layer, li, dense)
        lp = _prune_block(loop, block, _copy(planned))
        ctx.io.solved(li)
        if li < last_pruned:  # the next block still has something to prune: feed it
            runner.advance(layer)
        runner.restore(layer)
        if ctx.speed is not None:
            ctx.speed.time(before, layer, _forward_on(runner, li), runner.device)
            before = None  # the dense copy goes before the next block comes
        realised.append(lp)
        layout.append({"heads": lp.heads, "kv_heads": lp.kv_heads, "neurons": len(lp.neurons), "bias": block.added})
        ctx.io.done(li, layer)
        _show(bar, loop.reports, li, ctx.show_progress)
        if saver is not None:
            saver.after(li, runner, split, loop.reports, realised, layout)
    bar.close()
    checkpoints = saver.metrics if saver is not None else {}
    plan = Plan(realised, plan.block_params, plan.target_removed)
    return Reconstructed(plan, loop.reports.finish(), layout, checkpoints)


def _prune_block(loop: _Loop, block: _Block, lp: LayerPlan) -> LayerPlan:
    """Prune and reconstruct one block's attention, then its FFN; returns the block's realised plan."""
    adapter, runner = loop.run.adapter, loop.data.runner
    fam = adapter.family
    choose = _chooser(loop, block, lp)
    if len(lp.heads) < adapter.n_heads or choose.splits:
        lp = _prune_part(loop, block, ATTENTION, lp, choose)
        # later passes over this block replay the pruned attention instead of recomputing it
        keep = _keep_mask(adapter, ATTENTION, lp)
        runner.replay(block.layer, fam.attn, fam.o, keep, returns_tuple=True, bypass=(fam.attn_input_norm,))
    if len(lp.neurons) < adapter.n_neurons:
        # a sequential pre-norm block: the FFN pass folds the replayed attention output into the stored
        # block inputs (the residual stream entering the FFN), so the two are not kept side by side
        fold = fam.attn in runner.replays and fam.ffn_input_norm is not None
        handle = runner.absorb(block.layer, fam.attn, fam.ffn_input_norm) if fold else None
        try:
            lp = _prune_part(loop, block, FFN, lp, choose)
        finally:
            if handle is not None:
                handle.remove()
        if not _recomputes(loop, FFN):  # else the output pass runs the pruned FFN
            keep, skip = _keep_mask(adapter, FFN, lp), (fam.ffn_input_norm, fam.ffn_inline_act)
            runner.replay(block.layer, fam.ffn_block, fam.ffn_out, keep, returns_tuple=False, bypass=skip)
    return lp


def _prune_part(loop: _Loop, block: _Block, part: str, lp: LayerPlan, choose: Strategy) -> LayerPlan:
    """collect → choose → cut → solve → write for one projection of the block; returns the layer's plan
    with the units this part kept."""
    t0 = time.perf_counter()
    adapter, path = loop.run.adapter, _path(loop.run.adapter, part)
    fit = _collect(loop, block, part, lp, choose)
    lin = block.layer.get_submodule(path)
    w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()  # the unpruned weights
    lp = (choose.heads if part == ATTENTION else choose.neurons)(lp, w, fit.stats)
    keep = _keep_mask(adapter, part, lp)
    if bool(keep.all()):  # the selection kept every unit (head_ratio obs): nothing to cut or refit
        fit.free()
        return lp
    _cut(loop, block, part, lp)
    solved = fit.solve(w, b, keep.to(w.device), adapter.head_dim if part == ATTENTION else 1)
    fit.free()
    _write(block, path, solved)
    _report(loop, block, part, lp, solved, time.perf_counter() - t0)
    return lp


def _collect(loop: _Loop, block: _Block, part: str, lp: LayerPlan, choose: Strategy) -> Reconstruction:
    """Stream the projection's fit inputs into its reconstruction and keep what the block's later
    passes replay: only the planned channels, unless the strategy chooses them from the statistics;
    an FFN recomputed in the output pass keeps only the held-aside inputs (its error report's)."""
    data, path = loop.data, _path(loop.run.adapter, part)
    fit = loop.rebuild(data, path, block.layer.get_submodule(path).in_features, block.dense.get(path))
    channels = None
    if not choose.reads_stats:
        channels = _keep_mask(loop.run.adapter, part, lp).nonzero().squeeze(1).to(data.runner.device)
    keep_from = data.n_fit if _recomputes(loop, part) else 0
    kept = KeptInputs(channels=channels, full_from=data.n_fit, keep_from=keep_from)
    data.runner.collect(block.layer, path, _sinks(data, fit), kept)
    return fit


def _cut(loop: _Loop, block: _Block, part: str, lp: LayerPlan) -> None:
    """Remove the units ``lp`` does not keep from the block's attention or FFN."""
    fam = loop.run.adapter.family
    if part == ATTENTION:
        prune_heads_(block.layer, fam, loop.run.model.config, lp.heads, lp.kv_heads)
    else:
        prune_neurons_(block.layer, fam, lp.neurons)


def _write(block: _Block, path: str, solved: Solved) -> None:
    """The solved weights (and bias, given to a projection that had none) into the cut projection."""
    lin = block.layer.get_submodule(path)
    lin.weight.copy_(solved.weight.to(lin.weight.dtype))
    if solved.bias is not None:
        if lin.bias is None:
            ensure_bias(lin)
            block.added.append(path)
        lin.bias.copy_(solved.bias.to(lin.bias.dtype))


def _report(loop: _Loop, block: _Block, part: str, lp: LayerPlan, solved: Solved, seconds: float) -> None:
    adapter = loop.run.adapter
    kept, total = (len(lp.heads), adapter.n_heads) if part == ATTENTION else (len(lp.neurons), adapter.n_neurons)
    report = LayerReport(
        layer=block.index,
        module=part,
        kept=kept,  # the units really kept (a selection may change the plan's)
        total=total,
        error_before=float("nan"),  # filled in by Reports.finish()
        error_after=float("nan"),
        measured_on="held-aside" if loop.data.has_held else "calibration",
        seconds=seconds,
        peak_memory_mb=peak_memory_mb(loop.run.device),
    )
    loop.reports.add(report, solved.errors)


def _start(ctx: RunContext, calibration: tuple[CalibrationBatch, CalibrationBatch], split) -> _Loop:
    """The loop's runner on the calibration batches (the first block's inputs computed) and strategies."""
    recipe, recon = ctx.recipe, ctx.recipe.reconstruction
    fit, held = calibration
    fit_batches = split_batches(fit, recipe.calibration.batch_size)
    batches = fit_batches + split_batches(held, recipe.calibration.batch_size)
    runner = BlockRunner(ctx.model, ctx.adapter, batches, ctx.device, recon.positions, ctx.offload)
    if recon.target == "dense":
        runner.track_dense()
    ctx.io.inputs_ready()
    data = FitData(
        runner=runner,
        n_fit=len(fit_batches),
        has_held=len(held) > 0,
        stats_dtype=getattr(torch, recipe.stats_dtype),
        method=recon.method,
        damp=recon.damp,
    )
    obs = recon.resolved_select() == "obs"
    select = ByObs(ctx.adapter, recon.damp, ctx.kv_groups == "whole") if obs else ByCriterion()
    rebuild = reconstruction_for(recon.target)
    return _Loop(run=ctx, data=data, reports=Reports(), rebuild=rebuild, select=select, split=split)


def _chooser(loop: _Loop, block: _Block, lp: LayerPlan) -> Strategy:
    """The block's strategy: the run's selection, or under ``head_ratio: obs`` the layer's own split,
    whose FFN error curve is measured here on the still dense block (with the gains of the norms on
    its outputs, sandwich norms: both paths' errors are then the residual stream's)."""
    split, li = loop.split, block.index
    if split is None or not split.active(li, lp):
        return loop.select
    adapter, data = loop.run.adapter, loop.data
    runner, path = data.runner, adapter.family.ffn_out
    batch_mask, counted = lambda: runner.masks[runner.batch], lambda: runner.batch < data.n_fit
    gains, handles = hook_output_gains(block.layer, adapter, runner.device, batch_mask, counted)
    try:
        stats = InputStats(block.layer.get_submodule(path).in_features, data.stats_dtype, runner.device)
        runner.collect(block.layer, path, _sinks(data, stats))
    finally:
        for h in handles:
            h.remove()
    w_ffn = in_residual_units(block.layer.get_submodule(path).weight, gains.get("ffn"))
    limit, step = split.neuron_limit(li, adapter, lp), split.step(li, adapter, lp)
    curve = obs_curve(w_ffn, stats, limit, 1, data.damp, step=step)
    return ObsSplit(loop.select, split, li, curve, gains.get("attn"))


def _sinks(data: FitData, fit) -> list:
    """Per calibration batch, where collect() streams its inputs: ``fit`` for the fit batches."""
    return [fit] * data.n_fit + [_NO_STATS] * (len(data.runner.hidden) - data.n_fit)


def _forward_on(runner: BlockRunner, li: int):
    """Block ``li``'s forward on the first calibration batch's stored inputs, for its dense copy and its
    pruned self alike (the runner finds a block's arguments by the block, and the copy is not one of the
    model's). The inputs are fetched once, so a batch kept on the host is not copied inside a timing."""
    x = runner.offload.fetch(runner.hidden[0])
    args, kwargs = runner.extra[0][li]
    return lambda block: block(x, *args, **kwargs)


def _prunes(loop: _Loop, li: int, lp: LayerPlan) -> bool:
    a = loop.run.adapter
    own_split = loop.split is not None and loop.split.active(li, lp)
    return len(lp.heads) < a.n_heads or len(lp.neurons) < a.n_neurons or own_split


def _pruned_paths(loop: _Loop, li: int, lp: LayerPlan) -> list[str]:
    """The projections of block ``li`` whose inputs may be pruned (both when it splits on its own)."""
    a = loop.run.adapter
    if loop.split is not None and loop.split.active(li, lp):
        return [a.family.o, a.family.ffn_out]
    return [a.family.o] * (len(lp.heads) < a.n_heads) + [a.family.ffn_out] * (len(lp.neurons) < a.n_neurons)


def _recomputes(loop: _Loop, part: str) -> bool:
    """Whether the block's output pass recomputes ``part``'s inputs instead of replaying kept ones
    (the FFN, with ``activations: recompute`` or host)."""
    return part == FFN and loop.data.runner.offload.recompute


def _path(adapter: Adapter, part: str) -> str:
    return adapter.family.o if part == ATTENTION else adapter.family.ffn_out


def _keep_mask(adapter: Adapter, part: str, lp: LayerPlan) -> torch.Tensor:
    """The kept input channels of ``part``'s projection under ``lp`` (bool, on the host)."""
    kept, total, width = (
        (lp.heads, adapter.n_heads, adapter.head_dim) if part == ATTENTION else (lp.neurons, adapter.n_neurons, 1)
    )
    keep = torch.zeros(total, dtype=torch.bool)
    keep[kept] = True
    return keep.repeat_interleave(width) if width > 1 else keep


def _copy(lp: LayerPlan) -> LayerPlan:
    """A layer plan the loop may hand on without the planned one's lists being shared."""
    return replace(lp, heads=list(lp.heads), kv_heads=list(lp.kv_heads), neurons=lp.neurons.clone())


def _show(bar, reports: Reports, li: int, show: bool) -> None:
    bar.update(1)
    if show:  # reading the errors here synchronises a GPU run once per layer
        errs = [r for r in reports.finish() if r.layer == li]
        bar.set_postfix_str(" ".join(f"{r.module[:4]} err {r.error_before:.3f}→{r.error_after:.3f}" for r in errs))
