"""Depth pruning of a streamed model, one block in memory: the span chosen by block-major passes over
the checkpoint's blocks (``core/depth/blockwise.py``: the numbers of the in-memory choice), then taken
out of the skeleton so that everything after sees the shorter model — the width pruning's scoring pass
and block loop, and the writer, which names the kept blocks by their new positions.

The skeleton loses the span as a model in memory does (:func:`~core.depth.replace.remove_blocks`:
``layer_idx``, ``num_hidden_layers`` and the per-layer config lists such as ``layer_types``), each kept
block is still read from its own place in the checkpoint (:meth:`StreamedModel.keep_blocks`), and the
stand-in is folded into block ``start − 1``'s down projection every time that block is materialised
(:attr:`StreamedModel.edits`), so its scores, its width pruning and its written shard all see the
folded block.

Peak memory beside one block: the passes' activations (``core/depth/blockwise.py`` sizes them; kept
where ``activations`` says, as :func:`depth_offload` decides), one span's float64 sums (``4 d²`` with a
stand-in), and for ``select: loss`` the candidates' stand-ins on the host and, after the last block,
the final norm and head with one batch's logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from core.data.calibration import CalibrationBatch
from core.depth.blockwise import Walk, Windows, choose_span_by_blocks, enter
from core.depth.replace import fold_linear, remove_blocks
from core.depth.select import SpanChoice
from core.evaluation.streamed import output_logits
from core.models.offload import Offload, block_working_bytes, choose_offload
from core.models.streaming import StreamedModel
from core.pipeline.context import Progress
from core.pipeline.depth import split_held
from core.pipeline.measure import BlockSpeed
from core.pipeline.scoring import split_batches
from core.spec.recipe import Recipe


def depth_offload(recipe: Recipe, sm: StreamedModel, batches: tuple[list, list], blocks: int) -> Offload:
    """Where the depth passes keep their activations (``recipe.activations``; ``auto``: on the device
    when the larger pass's activations fit beside one block's work, else in host memory): the fit pass holds
    about ``2k + 1`` hidden-size rows per fit token, the loss pass ``1 + v (n − k)`` per held-aside token
    (``v`` stand-ins per candidate)."""
    fit, held = batches
    adapter, itemsize = sm.adapter, sm.dtype.itemsize
    n, d = adapter.n_layers, adapter.hidden
    tokens = [sum(b.input_ids.numel() for b in part) for part in (fit, held)]
    rows = [(2 * blocks + 1) * tokens[0]]
    if recipe.depth.select == "loss":
        rows.append((1 + (2 if recipe.depth.reconstruction == "ls" else 1) * (n - blocks)) * tokens[1])
    needed = max(rows) * d * itemsize
    batch_tokens = max(b.input_ids.numel() for b in fit + held)
    logits = batch_tokens * sm.model.config.vocab_size * (itemsize + 4)
    working = block_working_bytes(sm.layers[0], adapter, batch_tokens, itemsize, matrices=0) + 4 * d * d * 8 + logits
    return choose_offload(recipe.activations, sm.device, needed, working)


def choose_span_streamed(
    sm: StreamedModel,
    recipe: Recipe,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    report: Progress,
    speed: BlockSpeed | None = None,
) -> SpanChoice:
    """The span to remove, chosen on the ``(fit, held-aside)`` windows as :func:`core.pipeline.depth.
    remove_depth` chooses it, each block read once per pass (two passes for ``select: loss``, else
    one); ``report("depth", i, total)`` after every block. The embeddings must be on the device; the
    final norm and head are read after the last block of the loss pass and left there. ``speed``:
    every block is timed in the fit pass on the first fit batch (:meth:`BlockSpeed.add_depth`)."""
    fit, held = calibration
    size = recipe.calibration.batch_size
    batches = split_batches(fit, size), split_held(held, fit, size)
    n, d = sm.adapter.n_layers, recipe.depth
    blocks = recipe.depth_blocks(n)
    offload = depth_offload(recipe, sm, batches, blocks)
    total, done = n * (2 if d.select == "loss" else 1), [0]
    report("depth", 0, total)
    times: list[list[float]] = []
    entered: dict[str, Windows] = {}

    def load(i: int):
        layer = sm.load_block(i)
        sm.prefetch(i + 1)
        if speed is not None and len(times) == i and "held" not in entered:  # the fit pass: its inputs
            times.append(_time_block(speed, layer, entered["fit"], i, offload, sm.device))
        return layer

    def progress() -> None:
        done[0] += 1
        report("depth", done[0], total)

    def windows(which: str) -> Windows:
        sm.prefetch(0)  # read while the embeddings run
        entered.pop("fit", None)  # the fit pass is over when the held-aside windows enter: let its states go
        entered[which] = enter(sm.model, sm.adapter, batches[which == "held"], sm.device, offload)
        return entered[which]

    def logits() -> Callable[[torch.Tensor], torch.Tensor]:
        sm.load_outer()
        return output_logits(sm)

    walk = Walk(n=n, load=load, free=sm.free_block, offload=offload, progress=progress)
    choice = choose_span_by_blocks(walk, windows, sm.adapter, logits, (blocks, d.select, d.reconstruction, d.damp))
    if speed is not None:
        speed.add_depth(times, set(choice.blocks), recipe.modules == "blocks")
    return choice


def _time_block(speed: BlockSpeed, layer, fit: Windows, i: int, offload: Offload, device) -> list[float]:
    """Block i's dense forward time on the first fit batch's inputs to it (:meth:`BlockSpeed.time_alone`)."""
    x = offload.fetch(fit.hidden[0])
    args, kwargs = fit.extra[0][i]
    return speed.time_alone(layer, lambda block: block(x, *args, **kwargs), device)


def drop_span(sm: StreamedModel, choice: SpanChoice) -> None:
    """Take the chosen span out of the streamed skeleton (see the module docstring)."""
    n, gone = len(sm.layers), set(choice.blocks)
    remove_blocks(sm.model, sm.adapter, choice.blocks)
    sm.keep_blocks([i for i in range(n) if i not in gone])
    if choice.t is not None:
        t, path = choice.t, sm.adapter.family.ffn_out
        sm.edits[choice.start - 1] = lambda layer: fold_linear(layer.get_submodule(path), t)
