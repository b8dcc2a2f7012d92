"""Depth pruning inside a run: a span of whole blocks chosen on the calibration windows and removed
(stood in for by its least-squares map, ``core/depth``) before the width pruning, which then removes
what is left of the ratio from the blocks that stay. This module prunes a model in memory; a streamed
one goes through ``core/pipeline/streamed_depth.py``."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from core.allocation import Plan
from core.allocation.plan import LayerPlan
from core.data.calibration import CalibrationBatch
from core.depth.replace import DepthError
from core.depth.select import SpanChoice, apply_span, choose_span
from core.models.adapter import Adapter, block_parameters
from core.models.streaming import block_inputs
from core.pipeline.context import Progress
from core.pipeline.measure import BlockSpeed
from core.pipeline.scoring import split_batches
from core.spec.recipe import Recipe


def split_held(held: CalibrationBatch, fit: CalibrationBatch, size: int) -> list[CalibrationBatch]:
    """The windows the span's loss is measured on: the held-aside ones (the fit's last batch when none
    are held aside)."""
    if len(held):
        return split_batches(held, size)
    return split_batches(fit, size)[-1:]


def remove_depth(
    model: nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    report: Progress,
    speed: BlockSpeed | None = None,
) -> dict[str, Any]:
    """Choose the span on the ``(fit, held-aside)`` windows and remove it from ``model`` (in place);
    returns the run's depth metrics. ``adapter``: the dense model's (its layer count changes);
    ``speed``: every block is timed first on the first fit batch (:meth:`BlockSpeed.add_depth`)."""
    t0 = time.perf_counter()
    fit, held = calibration
    n = adapter.n_layers
    blocks = recipe.depth_blocks(n)
    report("depth", 0, 1)
    size = recipe.calibration.batch_size
    device = next(model.parameters()).device
    times = time_blocks(model, adapter, split_batches(fit, size)[0], speed, device) if speed is not None else []
    d = recipe.depth
    try:
        choice = choose_span(
            model,
            adapter,
            split_batches(fit, size),
            split_held(held, fit, size),
            blocks,
            d.select,
            d.reconstruction,
            d.damp,
        )
    except DepthError as exc:
        raise ValueError(str(exc)) from None
    apply_span(model, adapter, choice)
    if speed is not None:
        speed.add_depth(times, set(choice.blocks), recipe.modules == "blocks")
    report("depth", 1, 1)
    return depth_metrics(choice, recipe, n, time.perf_counter() - t0)


@torch.no_grad()
def time_blocks(model: nn.Module, adapter: Adapter, batch: CalibrationBatch, speed: BlockSpeed, device) -> list:
    """Every block's dense forward time on ``batch`` (:meth:`BlockSpeed.time_alone`), each block on
    its own inputs (the previous block's output)."""
    hidden, extra = block_inputs(model, adapter, [batch.model_inputs(adapter.kind, device)])
    x, times = hidden[0], []
    for layer, (args, kwargs) in zip(adapter.layers(model), extra[0], strict=True):
        times.append(speed.time_alone(layer, lambda block, x=x, a=args, k=kwargs: block(x, *a, **k), device))
        out = layer(x, *args, **kwargs)
        x = out[0] if isinstance(out, tuple) else out
    return times


def depth_metrics(choice: SpanChoice, recipe: Recipe, n: int, seconds: float) -> dict[str, Any]:
    """The run's depth metrics: the span removed from the model's ``n`` blocks and its scores."""
    d = recipe.depth
    chosen = choice.candidates[choice.start]
    return {
        "depth_blocks_removed": choice.blocks,
        "depth_layers_before": n,
        "depth_select": d.select,
        "depth_reconstruction": d.reconstruction,
        "depth_weighting": None if choice.t is None else ("per-token" if choice.weighted else "plain"),
        **{f"depth_{k}": round(v, 6) for k, v in chosen.items()},
        "depth_seconds": round(seconds, 3),
    }


def kept_plan(model: nn.Module, adapter: Adapter, block_params_before: int) -> tuple[Plan, list[dict[str, Any]]]:
    """The plan and layout of a model whose remaining blocks keep every unit (a depth-only run;
    ``adapter``: the model's after the blocks went)."""
    heads, kv = list(range(adapter.n_heads)), list(range(adapter.n_kv_heads))
    layers = [LayerPlan(heads, kv, torch.arange(adapter.n_neurons)) for _ in range(adapter.n_layers)]
    removed = block_params_before - block_parameters(model, adapter)
    plan = Plan(layers, block_params_before, removed)
    plan.removed = removed  # the removed blocks are not among the plan's layers
    layout = [{"heads": heads, "kv_heads": kv, "neurons": adapter.n_neurons, "bias": []} for _ in layers]
    return plan, layout
