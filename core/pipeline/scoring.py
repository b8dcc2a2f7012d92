"""Criterion scores for every layer, with the data each criterion declares it needs collected on
the dense model (per-channel input statistics, or gradients of the calibration loss)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core import criteria
from core.criteria import LayerInputs, Scores
from core.criteria.base import GramInputs
from core.criteria.gradients import check_loss_data, mask_gradients, weight_gradients
from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter
from core.models.offload import Offload
from core.pipeline.runner import BlockRunner
from core.spec.criteria import parse_options
from core.spec.recipe import Recipe
from core.stats.accumulate import ChannelStats, InputStats, OutputGain


def hook_layer_inputs(
    layer: nn.Module,
    adapter: Adapter,
    device,
    mask: Callable[[], torch.Tensor | None],
    second_order: bool = False,
    stats_dtype: torch.dtype = torch.float64,
):
    """``(inputs, hook handles)``: per-channel statistics of the layer's o_proj / down_proj inputs
    (:class:`LayerInputs`), fed by forward pre-hooks (``mask()``: the current batch's token mask); with
    ``second_order`` their Gram statistics instead (:class:`GramInputs`: each batch's product in
    ``stats_dtype``), those of the residual stream entering the block and the gains of the norms on
    the attention's and the FFN's outputs where the family has them."""
    fam = adapter.family
    o, ffn = layer.get_submodule(fam.o), layer.get_submodule(fam.ffn_out)
    entry: LayerInputs | GramInputs
    if second_order:
        gains, handles = hook_output_gains(layer, adapter, device, mask)
        entry = GramInputs(
            attn_gram=InputStats(o.in_features, stats_dtype, device),
            ffn_gram=InputStats(ffn.in_features, stats_dtype, device),
            residual=ChannelStats(adapter.hidden, device),
            attn_gain=gains.get("attn"),
            ffn_gain=gains.get("ffn"),
        )
        sinks = [(o, entry.attn_gram), (ffn, entry.ffn_gram)]
    else:
        entry, handles = LayerInputs(ChannelStats(o.in_features, device), ChannelStats(ffn.in_features, device)), []
        sinks = [(o, entry.attn), (ffn, entry.ffn)]
    handles += [m.register_forward_pre_hook(lambda _m, a, sink=sink: sink.add_batch(a[0], mask())) for m, sink in sinks]
    if second_order:
        residual = entry.residual

        def hook(_m, args, kwargs):
            residual.add_batch(args[0] if args else kwargs["hidden_states"], mask())

        handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    return entry, handles


def hook_output_gains(
    layer: nn.Module, adapter: Adapter, device, mask: Callable[[], torch.Tensor | None], counted=lambda: True
) -> tuple[dict[str, OutputGain], list]:
    """``({"attn": gain, "ffn": gain}, hook handles)``: the squared gains of the norms on the block's
    attention and FFN outputs (sandwich norms; none where the family adds the outputs as they are),
    fed by forward hooks on the batches where ``counted()``."""
    fam, gains, handles = adapter.family, {}, []
    for key, path in (("attn", fam.attn_output_norm), ("ffn", fam.ffn_output_norm)):
        if path is None:
            continue
        gains[key] = gain = OutputGain(adapter.hidden, device)

        def hook(_m, a, z, g=gain):
            if counted():
                g.add_batch(a[0], z, mask())

        handles.append(layer.get_submodule(path).register_forward_hook(hook))
    return gains, handles


@dataclass(frozen=True, kw_only=True)
class BlockPass:
    """How a scoring pass over the blocks runs: where it keeps its activations, how each block comes
    and goes (``load(i)`` / ``free(i)``: a streamed run reads block i from the checkpoint and frees it
    after) and what it reports (``progress(i + 1)`` after block i)."""

    offload: Offload | None = None
    load: Callable[[int], None] | None = None
    free: Callable[[int], None] | None = None
    progress: Callable[[int], None] | None = None


def score_by_blocks(
    recipe: Recipe, adapter: Adapter, layers, runner: BlockRunner | None = None, blocks: BlockPass | None = None
) -> list[Scores]:
    """Every layer's raw scores (before ``finalize``) by the recipe's criterion, one block at a time on
    the dense model's hidden states (``runner``): the block is run on the calibration data only when
    the criterion needs its inputs (Gram products in the recipe's ``stats_dtype``)."""
    name = recipe.criterion.name
    criterion, opts = criteria.get(name), parse_options(name, recipe.criterion.options)
    stats_dtype = getattr(torch, recipe.stats_dtype)
    blocks = blocks or BlockPass()
    scores = []
    for i, layer in enumerate(layers):
        if blocks.load is not None:
            blocks.load(i)
        data = None
        if criterion.needs == "inputs":
            mask = lambda: runner.masks[runner.batch]  # noqa: E731
            second = criterion.second_order
            data, handles = hook_layer_inputs(layer, adapter, runner.device, mask, second, stats_dtype)
            try:
                runner.advance(layer)
            finally:
                for h in handles:
                    h.remove()
        scores.append(criterion.score(layer, adapter, i, opts, data))
        if blocks.free is not None:
            blocks.free(i)
        if blocks.progress is not None:
            blocks.progress(i + 1)
    return scores


@torch.no_grad()
def dense_inputs(model: nn.Module, adapter: Adapter, batches: list[CalibrationBatch], device) -> list[LayerInputs]:
    """Per-channel statistics of every layer's o_proj / down_proj inputs on the dense model."""
    stats, handles, mask = [], [], [None]
    for layer in adapter.layers(model):
        entry, hooks = hook_layer_inputs(layer, adapter, device, lambda: mask[0])
        stats.append(entry)
        handles += hooks
    try:
        for b in batches:
            mask[0] = b.token_mask(adapter.kind, device)
            model.base_model(**b.model_inputs(adapter.kind, device))
    finally:
        for h in handles:
            h.remove()
    return stats


def score_layers(
    model: nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    batches: list[CalibrationBatch],
    device,
    blocks: BlockPass | None = None,
) -> list:
    """Every layer's criterion scores, with the data the criterion needs collected on the dense model
    (``blocks``: where a second-order criterion's block-by-block pass keeps its activations, and its
    progress after each block)."""
    name = recipe.criterion.name
    criterion, opts = criteria.get(name), parse_options(name, recipe.criterion.options)
    layers = adapter.layers(model)
    data: list[Any] = [None] * len(layers)
    if criterion.second_order:  # one layer's Gram statistics at a time
        blocks = blocks or BlockPass()
        runner = BlockRunner(model, adapter, batches, device, offload=blocks.offload)
        return criterion.finalize(score_by_blocks(recipe, adapter, layers, runner, blocks), opts)
    if criterion.needs == "inputs":
        data = dense_inputs(model, adapter, batches, device)
    elif criterion.needs == "gradients":
        flag = criterion.gradient_flag(opts)
        available = sum(len(b) for b in batches)
        wanted = opts.samples or available
        if wanted > available:
            raise ValueError(
                f"{name}: samples={wanted} but the calibration has {available}; raise "
                "calibration.num_calibration_samples or lower samples"
            )
        chosen = split_batches(CalibrationBatch.concat(batches).slice(0, wanted), recipe.calibration.batch_size)
        check_loss_data(model, adapter, chosen[0], name)
        ckpt = opts.checkpointing
        if criterion.gradients == "mask":
            data = mask_gradients(model, adapter, chosen, keep_samples=flag, checkpointing=ckpt)
        else:
            data = weight_gradients(model, adapter, chosen, second_order=flag, checkpointing=ckpt)
    scores = [criterion.score(layer, adapter, i, opts, data[i]) for i, layer in enumerate(layers)]
    return criterion.finalize(scores, opts)


def split_batches(batch: CalibrationBatch, size: int) -> list[CalibrationBatch]:
    return [batch.slice(i, i + size) for i in range(0, len(batch), size)]
