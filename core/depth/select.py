"""Choosing which contiguous span of blocks to remove, and removing it.

Every candidate span ``[s, s + n)`` (``s ≥ 1``: the stand-in folds into the block before it) gets its
least-squares stand-in from one calibration pass (:func:`core.depth.replace.fit_spans`), fitted both
per-token weighted (each token's direction, as the next RMS norm reads it) and plain. The span is then
chosen by one of:

- ``loss`` (the default): the next-token loss on the held-aside calibration windows of the model with
  the span removed as ``reconstruction`` says — with ``ls`` that is the stand-in's own end-to-end
  error on tokens it was not fitted on (ours); with ``none`` it is SLEB's perplexity criterion. Of the
  two fits of a span, the one with the lower held-aside loss is kept.
- ``fit``: the stand-in's relative error on the calibration tokens (a local score, no extra passes).
- ``angular``: ShortGPT's angular distance between the span's input and output.

A local score misleads where a span changes the residual stream wholesale: on SmolLM2 the weighted fit's
own error picks the span 1–8, whose held-out perplexity is 1.7× that of 12–19 (docs/results/depth.md).

:func:`choose_span` works on a model in memory: the fit pass is one whole-model pass, and the losses come
from one walk along the blocks (:func:`held_losses`: each candidate starts from the dense hidden states
entering its span's block before, so the blocks before that are not run again for it);
``core/depth/blockwise.py`` computes the same numbers one block at a time (a streamed model). Both go
through :func:`check_request`, :func:`solved_row`, :func:`local_scores`, :func:`loss_stand_ins`,
:func:`record_losses` and :func:`pick`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import get_args

import torch
from torch import nn

from core.depth.replace import (
    DepthError,
    SpanFit,
    check_foldable,
    fit_spans_weighted,
    fold,
    fold_linear,
    model_inputs,
    remove_blocks,
)
from core.models.adapter import Adapter
from core.models.streaming import block_inputs, head_logits
from core.spec.depth import DepthConfig

SELECTIONS = get_args(DepthConfig.model_fields["select"].annotation)  # loss | fit | angular
RECONSTRUCTIONS = get_args(DepthConfig.model_fields["reconstruction"].annotation)  # ls | none


@dataclass
class SpanChoice:
    """The span ``[start, end)`` chosen, its stand-in ``t`` (None: plain removal) and every candidate's
    scores (``{start: {score: value}}``), for the run's report."""

    start: int
    end: int
    t: torch.Tensor | None
    weighted: bool
    candidates: dict[int, dict[str, float]]

    @property
    def blocks(self) -> list[int]:
        return list(range(self.start, self.end))


@torch.no_grad()
def held_loss(model: nn.Module, adapter: Adapter, batches) -> float:
    """Mean next-token cross-entropy over the real tokens of ``batches`` (each token predicted from the
    ones before it in its window)."""
    device = next(model.parameters()).device
    inputs = (model_inputs(batch, adapter, device) for batch in batches)
    return windows_loss((model(**i).logits, i["input_ids"], i["attention_mask"]) for i in inputs)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """``(summed cross-entropy, tokens)`` of one batch: ``logits`` (batch, length, vocab) predicting
    ``ids`` (batch, length) one position on, where both positions are real (``mask``)."""
    logits = logits[:, :-1].float()
    target = ids[:, 1:]
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    loss = nn.functional.cross_entropy(logits[real], target[real], reduction="sum")
    return float(loss), int(real.sum())


def windows_loss(scored) -> float:
    """Mean next-token loss over ``scored``: ``(logits, ids, mask)`` per batch (:func:`next_token_loss`)."""
    total, count = 0.0, 0
    for logits, ids, mask in scored:
        loss, tokens = next_token_loss(logits, ids, mask)
        total, count = total + loss, count + tokens
    return mean_loss(total, count)


def mean_loss(total: float, count: int) -> float:
    if count == 0:
        raise DepthError("the held-aside windows have no tokens to score the spans on")
    return total / count


@contextmanager
def folded(down: nn.Linear, t: torch.Tensor | None) -> Iterator[None]:
    """``down`` with the stand-in ``t`` folded in (:func:`~core.depth.replace.fold_linear`; None: as it
    is), restored bit for bit on exit."""
    if t is None:
        yield
        return
    saved = (down.weight.detach().clone(), None if down.bias is None else down.bias.detach().clone())
    fold_linear(down, t)
    try:
        yield
    finally:
        with torch.no_grad():
            down.weight.copy_(saved[0])
            if saved[1] is not None:
                down.bias.copy_(saved[1])


def check_request(adapter: Adapter, n: int, blocks: int, select: str, reconstruction: str) -> bool:
    """Refuse a span request that cannot be met (:class:`DepthError`); returns whether the candidates
    need their least-squares stand-ins (``reconstruction: ls`` or ``select: fit``)."""
    if select not in SELECTIONS:
        raise DepthError(f"unknown span selection {select!r}; choose one of {', '.join(SELECTIONS)}")
    if reconstruction not in RECONSTRUCTIONS:
        raise DepthError(f"unknown depth reconstruction {reconstruction!r}; choose one of {', '.join(RECONSTRUCTIONS)}")
    if not 1 <= blocks <= n - 2:
        raise DepthError(
            f"a model of {n} blocks can lose 1 to {max(n - 2, 0)} of them (the first stays, and one after it); "
            f"{blocks} asked"
        )
    stand_in = reconstruction == "ls" or select == "fit"
    if stand_in:
        check_foldable(adapter, 1)
    return stand_in


def solved_row(fits: dict[bool, SpanFit], scores: dict[str, float], damp: float) -> dict:
    """A span's removal scores and its stand-ins solved: ``{"scores": …, "fits": {weighted: (T, fit
    error)}}``."""
    solved = {weighted: fit.solve(damp) for weighted, fit in fits.items()}
    return {"scores": scores, "fits": {w: (t, fits[w].relative_error(t)) for w, t in solved.items()}}


def local_scores(row: dict, stand_in: bool) -> dict[str, float]:
    """A candidate's scores known from the fit pass alone."""
    cand = dict(row["scores"])
    if stand_in:
        cand.update(fit_error=row["fits"][True][1], fit_error_plain=row["fits"][False][1])
    return cand


def loss_stand_ins(row: dict, reconstruction: str) -> dict[str, torch.Tensor | None]:
    """The variants of a candidate whose held-aside loss is measured, by the score each fills: with
    ``ls`` each fit in place (the better one counts), with ``none`` the span removed."""
    if reconstruction == "ls":
        return {"loss_weighted": row["fits"][True][0], "loss_plain": row["fits"][False][0]}
    return {"loss": None}


def record_losses(cand: dict[str, float], losses: dict[str, float]) -> None:
    cand.update(losses)
    if "loss_weighted" in losses:
        cand["loss"] = min(cand["loss_weighted"], cand["loss_plain"])


def _fit_both(model, adapter, batches, spans, damp, stand_in: bool):
    """Each span's weighted and plain stand-ins with their fit errors (with ``stand_in``), and its
    removal scores."""
    weightings = (True, False) if stand_in else ()
    rows = fit_spans_weighted(model, adapter, batches, spans, weightings).items()
    return {s: solved_row(fits, scores, damp) for (s, _), (fits, scores) in rows}


def choose_span(
    model: nn.Module,
    adapter: Adapter,
    fit_batches,
    held_batches,
    blocks: int,
    select: str = "loss",
    reconstruction: str = "ls",
    damp: float = 0.01,
) -> SpanChoice:
    """The span of ``blocks`` consecutive blocks to remove (see the module docstring)."""
    n = len(adapter.layers(model))
    stand_in = check_request(adapter, n, blocks, select, reconstruction)
    spans = [(s, s + blocks) for s in range(1, n - blocks + 1)]
    rows = _fit_both(model, adapter, fit_batches, spans, damp, stand_in)
    candidates = {s: local_scores(row, stand_in) for s, row in rows.items()}
    if select == "loss":
        stand_ins = {s: loss_stand_ins(row, reconstruction) for s, row in rows.items()}
        losses = held_losses(model, adapter, held_batches, blocks, stand_ins)
        for s, cand in candidates.items():
            record_losses(cand, losses[s])
    return pick(candidates, rows, blocks, select, reconstruction)


def apply_block(layer: nn.Module, x: torch.Tensor, arguments: tuple[tuple, dict]) -> torch.Tensor:
    """Block ``layer`` on hidden states ``x`` with its other arguments (``block_inputs``' ``extra``)."""
    args, kwargs = arguments
    out = layer(x, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def held_losses(
    model: nn.Module, adapter: Adapter, batches, blocks: int, stand_ins: dict[int, dict[str, torch.Tensor | None]]
) -> dict[int, dict[str, float]]:
    """Every candidate's held-aside loss, ``{s: {score: loss}}`` for ``stand_ins`` (``{s: {score: T, or
    None for the span removed}}``, :func:`loss_stand_ins`): the loss :func:`held_loss` gives for the model
    with blocks ``[s, s + blocks)`` left out and ``T`` folded into block ``s − 1``, from one walk along
    the blocks. The windows' dense hidden states advance a block at a time; a candidate starts from those
    entering block ``s − 1`` and runs that block (folded), the blocks after its span, and the head. On
    SmolLM2 (30 blocks, 4 removed) that is half the block passes of whole-model passes per candidate;
    memory: two hidden states of the windows. Each block gets the mask and rotary embeddings of its own
    type, as in the model cut for good (:func:`~core.depth.replace.remove_blocks`)."""
    layers = adapter.layers(model)
    n, out_path = len(layers), adapter.family.ffn_out
    device = next(model.parameters()).device
    inputs = [{**model_inputs(b, adapter, device), "use_cache": False} for b in batches]
    dense, extra = block_inputs(model, adapter, iter(inputs))
    head = head_logits(model, adapter)
    losses: dict[int, dict[str, float]] = {}
    at = 0  # ``dense``: the states entering block ``at``
    for s in sorted(stand_ins):
        for j in range(at, s - 1):
            dense = [apply_block(layers[j], x, extra[b][j]) for b, x in enumerate(dense)]
        at = s - 1
        for key, t in stand_ins[s].items():
            if t is not None:
                check_foldable(adapter, s)
            with folded(layers[s - 1].get_submodule(out_path), t):
                state = [apply_block(layers[s - 1], x, extra[b][s - 1]) for b, x in enumerate(dense)]
            for j in range(s + blocks, n):
                state = [apply_block(layers[j], x, extra[b][j]) for b, x in enumerate(state)]
            scored = ((head(x), i["input_ids"], i["attention_mask"]) for x, i in zip(state, inputs, strict=True))
            losses.setdefault(s, {})[key] = windows_loss(scored)
    return losses


SCORE_OF = {"loss": "loss", "fit": "fit_error", "angular": "angular_distance"}  # the score each selection reads


def pick(candidates: dict[int, dict[str, float]], rows: dict[int, dict], blocks: int, select: str, reconstruction: str):
    """The candidate with the least score of ``select`` (the first on a tie) as a :class:`SpanChoice`;
    ``rows[start]`` must still hold its stand-ins."""
    key = SCORE_OF[select]
    start = min(candidates, key=lambda s: (candidates[s][key], s))
    cand = candidates[start]
    weighted = select != "loss" or reconstruction != "ls" or cand["loss_weighted"] <= cand["loss_plain"]
    t = rows[start]["fits"][weighted][0] if reconstruction == "ls" else None
    if t is not None and not bool(torch.isfinite(t).all()):
        raise DepthError(f"the stand-in for blocks {start}–{start + blocks - 1} is not finite")
    return SpanChoice(start, start + blocks, t, weighted, candidates)


def apply_span(model: nn.Module, adapter: Adapter, choice: SpanChoice) -> None:
    """Fold the chosen stand-in (if any) and take the span's blocks out of the model for good."""
    if choice.t is not None:
        fold(model, adapter, choice.start, choice.t)
    remove_blocks(model, adapter, choice.blocks)
