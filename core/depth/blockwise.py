"""Choosing the span to remove one block at a time, for a model whose blocks are materialised one by one
(a streamed checkpoint, ``core/pipeline/streamed_depth.py``): the numbers of :func:`core.depth.select.
choose_span` from block-major passes, each block applied to every calibration batch before the next
one is read.

**Fit pass** (every selection). The fit windows go through blocks ``0 … n − 1`` once. A span ``[s, s +
k)`` needs block ``s − 1``'s output ``h`` and its FFN output ``m`` (the stand-in's regressor, ``r = h −
m``) beside block ``s + k − 1``'s output ``y``, so the real tokens' ``h`` and ``m`` of the last ``k``
blocks wait (where the run's :class:`~core.models.offload.Offload` keeps activations: the device, or
host memory). When block ``s + k − 1`` has run, span ``s`` gets its statistics from exactly the
tensors :func:`~core.depth.replace.fit_spans_weighted` reads (the same rows, summed batch by batch in
the same order) and is solved at once: one span's float64 sums (two per fit, ``4 d²`` with both fits)
are alive at a time, not every span's. Memory: about ``2k + 1`` hidden-size rows per fit token in the
model's dtype (the waiting ``h`` and ``m`` of ``k`` blocks, and the hidden states).

**Loss pass** (``select: loss``). The held-aside windows go through the blocks once more, carrying
beside the dense hidden states one hidden state per candidate variant (a span's two fits with ``ls``,
the span removed with ``none``): a candidate joins at block ``s − 1`` (the block folded with its
stand-in, applied to the dense state; with ``none`` the dense output itself), waits while the blocks
of its span pass, and from block ``s + k`` on each block is applied to it too — each block read once
for every candidate that keeps it. After the last block ``logits`` (the final norm and head) gives each
candidate's next-token loss as :func:`~core.depth.select.held_loss` computes it on the model cut that
way. Memory: ``(1 + v (n − k))`` hidden states of the held-aside windows, ``v`` the variants per
candidate (2 with ``ls``, else 1): a 7B model (``d`` 4096, bfloat16) with 8 held-aside windows of 2048
tokens, 24 candidates and ``ls`` holds ≈ 6.6 GB of them; its stand-ins ``T`` (float64, ``d²`` each,
kept on the host until the choice) 6.4 GB more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from core.depth.replace import SpanFit, SpanTotals, model_inputs
from core.depth.select import (
    SCORE_OF,
    SpanChoice,
    apply_block,
    check_request,
    folded,
    local_scores,
    loss_stand_ins,
    pick,
    record_losses,
    solved_row,
    windows_loss,
)
from core.models.adapter import Adapter
from core.models.offload import Offload
from core.models.streaming import block_inputs


@dataclass(frozen=True, kw_only=True)
class Walk:
    """How a pass reaches ``n`` blocks: ``load(i)`` materialises block i on the device and returns it,
    ``free(i)`` releases it, ``offload`` keeps per-batch activations between blocks, ``progress()`` is
    called after every block (raising from it stops the pass)."""

    n: int
    load: Callable[[int], nn.Module]
    free: Callable[[int], None]
    offload: Offload
    progress: Callable[[], None] = lambda: None


@dataclass
class Windows:
    """Calibration windows entering the next block: per batch the hidden states (where the walk's
    ``offload`` keeps them), every block's other arguments (``extra[batch][block]``: sliding-window
    and full-attention blocks differ), the real-token mask and the token ids (both on the device)."""

    hidden: list[torch.Tensor]
    extra: list[list[tuple[tuple, dict]]]
    masks: list[torch.Tensor]
    ids: list[torch.Tensor]


def enter(model: nn.Module, adapter: Adapter, batches, device, offload: Offload) -> Windows:
    """The windows of ``batches`` (calibration batches, or dicts of ``input_ids`` and ``attention_mask``)
    entering the first block; only the embeddings run (they must be on the device)."""
    inputs = [{**model_inputs(b, adapter, device), "use_cache": False} for b in batches]
    hidden, extra = block_inputs(model, adapter, iter(inputs), keep=offload.store)
    return Windows(hidden, extra, [i["attention_mask"].bool() for i in inputs], [i["input_ids"] for i in inputs])


@torch.no_grad()
def fit_spans_by_blocks(
    walk: Walk,
    fit: Windows,
    adapter: Adapter,
    blocks: int,
    weightings: tuple[bool, ...],
    on_span: Callable[[int, dict[bool, SpanFit], dict[str, float]], None],
) -> None:
    """The fit pass (module docstring): ``on_span(start, fits, scores)`` for every span ``[start, start +
    blocks)``, ``start`` from 1, as soon as its last block has run — the statistics of
    :func:`~core.depth.replace.fit_spans_weighted` (``weightings``: per-token weighted and/or plain
    fits; none for the scores alone). ``fit`` is consumed: its hidden states advance block by block."""
    n, k, store, fetch = walk.n, blocks, walk.offload.store, walk.offload.fetch
    device, width = fit.masks[0].device, adapter.hidden
    waiting: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}  # block j: per batch (h, m) rows
    for j in range(n):
        layer = walk.load(j)
        starts, ends = j <= n - k - 1, j >= k  # block j precedes span j + 1 / ends span j − k + 1
        down: dict[str, torch.Tensor] = {}
        hook = None
        if starts and weightings:
            path = adapter.family.ffn_out
            hook = layer.get_submodule(path).register_forward_hook(lambda _m, _i, out, d=down: d.__setitem__("m", out))
        totals = SpanTotals({w: SpanFit(width, device) for w in weightings}) if ends else None
        kept = []
        try:
            for b, mask in enumerate(fit.masks):
                y = apply_block(layer, fetch(fit.hidden[b]), fit.extra[b][j])
                fit.hidden[b] = store(y)
                if ends:
                    h, m = waiting[j - k][b]
                    waiting[j - k][b] = None  # read once: freed as the batch's new rows come
                    totals.add(None if m is None else fetch(m), fetch(h), y[mask])
                if starts:
                    kept.append((store(y[mask]), store(down.pop("m")[mask]) if weightings else None))
        finally:
            if hook is not None:
                hook.remove()
        walk.free(j)
        waiting.pop(j - k, None)
        if starts:
            waiting[j] = kept
        if ends:
            on_span(j - k + 1, totals.fits, totals.scores())
        walk.progress()


@torch.no_grad()
def span_losses_by_blocks(
    walk: Walk,
    held: Windows,
    adapter: Adapter,
    blocks: int,
    stand_ins: dict[int, dict[str, torch.Tensor | None]],
    logits: Callable[[], Callable[[torch.Tensor], torch.Tensor]],
) -> dict[int, dict[str, float]]:
    """The loss pass (module docstring): the held-aside loss of the model with span ``[s, s + blocks)``
    replaced by each of ``stand_ins[s]`` (``{score name: T, or None for the span removed}``), as
    ``{s: {score name: loss}}``. ``logits()`` is called once after the last block: it brings the final
    norm and head in and returns the map from the last block's output to logits."""
    n, k, store, fetch = walk.n, blocks, walk.offload.store, walk.offload.fetch
    dense, held.hidden = held.hidden, []  # consumed: the dense states advance block by block
    states: dict[tuple[int, str], list[torch.Tensor]] = {}
    for j in range(n):
        layer = walk.load(j)
        joining = stand_ins.get(j + 1, {})  # the candidates whose span follows block j
        for key, t in joining.items():
            if t is not None:
                with folded(layer.get_submodule(adapter.family.ffn_out), t):
                    states[(j + 1, key)] = [
                        store(apply_block(layer, fetch(x), held.extra[b][j])) for b, x in enumerate(dense)
                    ]
        for (s, _), state in states.items():
            if j >= s + k:  # past the candidate's span
                for b, x in enumerate(state):
                    state[b] = store(apply_block(layer, fetch(x), held.extra[b][j]))
        if j < n - k:  # a later candidate still joins from the dense states
            dense = [store(apply_block(layer, fetch(x), held.extra[b][j])) for b, x in enumerate(dense)]
        for key, t in joining.items():
            if t is None:  # the span removed: the candidate goes on from block j's dense output
                states[(j + 1, key)] = list(dense)
        if j >= n - k - 1:  # no candidate joins after this block
            dense = []
        walk.free(j)
        walk.progress()
    head = logits()
    losses: dict[int, dict[str, float]] = {}
    for s, key in list(states):
        scored = zip((head(fetch(x)) for x in states.pop((s, key))), held.ids, held.masks, strict=True)
        losses.setdefault(s, {})[key] = windows_loss(scored)
    return losses


def choose_span_by_blocks(
    walk: Walk,
    windows: Callable[[str], Windows],
    adapter: Adapter,
    logits: Callable[[], Callable[[torch.Tensor], torch.Tensor]],
    request: tuple[int, str, str, float],
) -> SpanChoice:
    """:func:`~core.depth.select.choose_span` one block at a time: ``request`` is ``(blocks, select,
    reconstruction, damp)``; ``windows("fit")`` / ``windows("held")`` enter the fit and held-aside
    windows (called when each pass starts, so only one pass's windows are alive). A local selection
    (``fit``, ``angular``) keeps only the stand-in of the best candidate so far."""
    blocks, select, reconstruction, damp = request
    stand_in = check_request(adapter, walk.n, blocks, select, reconstruction)
    rows: dict[int, dict] = {}
    candidates: dict[int, dict[str, float]] = {}
    key = SCORE_OF[select]

    def on_span(start: int, fits: dict[bool, SpanFit], scores: dict[str, float]) -> None:
        rows[start] = solved_row(fits, scores, damp)
        candidates[start] = local_scores(rows[start], stand_in)
        if select != "loss":  # only the best candidate's weighted stand-in can be chosen
            best = min(candidates, key=lambda s: (candidates[s][key], s))
            for s, row in rows.items():
                row["fits"] = {w: (t if s == best and w else None, err) for w, (t, err) in row["fits"].items()}

    weightings = (True, False) if stand_in else ()
    fit_spans_by_blocks(walk, windows("fit"), adapter, blocks, weightings, on_span)
    if select == "loss":
        stand_ins = {s: loss_stand_ins(row, reconstruction) for s, row in rows.items()}
        losses = span_losses_by_blocks(walk, windows("held"), adapter, blocks, stand_ins, logits)
        for s, cand in candidates.items():
            record_losses(cand, losses[s])
    return pick(candidates, rows, blocks, select, reconstruction)
