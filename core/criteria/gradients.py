"""Gradients for the gradient-based criteria (SNIP, Kwon et al.'s Fisher, LLM-Pruner's Taylor).

Two kinds, both from the loss on the calibration samples:

- **Mask gradients**: every head and FFN neuron gets a multiplicative mask ``m = 1`` on its
  contribution (the inputs of ``o_proj`` / ``down_proj``); ``∂L_i/∂m`` per sample ``i`` is exact
  because the samples of a batch never interact and the batch loss is the *sum* of per-sample
  losses. The mask product runs in float32 (at least), so the reduction over tokens is float32 even
  for bfloat16 models. Returned per layer as ``(n_samples, units)`` matrices, or — when the
  criterion only needs them — as their sum over samples and the sum of their squares.
- **Weight gradients** of the prunable projections only (q/k/v/o, gate/up/down; every other
  parameter keeps ``requires_grad=False``, so no gradient memory is spent on embeddings, norms or
  the LM head). Each backward's gradient is moved into a float32 accumulator as soon as it is
  produced and the parameter's ``.grad`` is freed; the per-sample squared gradients (LLM-Pruner's
  second-order term) accumulate in float32 too.

Loss: causal-LM cross entropy over each window (decoders; mean over the window's predicted tokens),
or the task loss of a labelled encoder (cross entropy for classification heads, squared error for a
one-output regression head). ``checkpointing=True`` recomputes each block in the backward pass
(activation memory of one block instead of all), through ``torch.utils.checkpoint``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter


@dataclass
class MaskGrads:
    """Per-layer mask gradients: ``samples`` (n, units) when kept, else sums over samples."""

    heads_sum: torch.Tensor  # (n_heads,) Σ_i ∂L_i/∂m
    heads_sq: torch.Tensor  # (n_heads,) Σ_i (∂L_i/∂m)²   (empirical Fisher diagonal)
    neurons_sum: torch.Tensor
    neurons_sq: torch.Tensor
    heads_samples: torch.Tensor | None = None  # (n, n_heads)
    neurons_samples: torch.Tensor | None = None  # (n, n_neurons)


def check_loss_data(model: nn.Module, adapter: Adapter, batch: CalibrationBatch, criterion: str) -> None:
    """Clear errors when a gradient criterion has no loss to differentiate."""
    if adapter.kind == "decoder":  # causal-LM models always carry their LM head
        return
    arch = type(model).__name__
    if "ForSequenceClassification" not in arch:
        raise ValueError(
            f"the {criterion} criterion needs a task loss: for encoders it supports sequence-classification "
            f"models (got {arch}); use a data-free or activation criterion (magnitude, flap, kcm) instead"
        )
    if batch.labels is None:
        raise ValueError(
            f"the {criterion} criterion needs labelled calibration data for an encoder: set "
            "calibration.label_field to the field holding each record's label (a .jsonl / .json file)"
        )


def _per_sample_loss(model: nn.Module, adapter: Adapter, batch: CalibrationBatch, device) -> torch.Tensor:
    inputs = batch.model_inputs(adapter.kind, device)
    out = model(**inputs)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))  # float32 at least
    if adapter.kind == "decoder":
        ids = inputs["input_ids"]
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (B, L-1)
        mask = inputs["attention_mask"][:, 1:].to(nll.dtype)
        return (nll * mask).sum(1) / mask.sum(1).clamp_min(1)
    labels = batch.labels.to(device)
    if logits.shape[-1] == 1:  # regression head
        return (logits.squeeze(-1) - labels.float()) ** 2
    return F.cross_entropy(logits, labels.long(), reduction="none")


@contextmanager
def _checkpointed(layers: nn.ModuleList, enabled: bool) -> Iterator[None]:
    """Recompute each block during backward instead of storing its activations."""
    if not enabled:
        yield
        return
    for layer in layers:
        forward = layer.forward
        layer.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # back to the class's forward


@contextmanager
def _frozen(model: nn.Module, trainable: list[nn.Parameter]) -> Iterator[None]:
    """Only ``trainable`` require gradients while inside; restores every flag afterwards."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    keep = {id(p) for p in trainable}
    for p, _ in flags:
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
            p.grad = None


def mask_gradients(
    model: nn.Module,
    adapter: Adapter,
    batches: list[CalibrationBatch],
    *,
    keep_samples: bool,
    checkpointing: bool = False,
) -> list[MaskGrads]:
    """∂L_i/∂m for every head and neuron mask of every layer (see the module docstring)."""
    device = next(model.parameters()).device
    layers, fam = adapter.layers(model), adapter.family
    n_layers = len(layers)
    units = (adapter.n_heads, adapter.n_neurons)
    sums = [[torch.zeros(n, dtype=torch.float64, device=device) for n in units] for _ in range(n_layers)]
    sqs = [[torch.zeros(n, dtype=torch.float64, device=device) for n in units] for _ in range(n_layers)]
    samples: list[list[list[torch.Tensor]]] = [[[], []] for _ in range(n_layers)]
    masks: list[list[torch.Tensor]] = [[None, None] for _ in range(n_layers)]
    d = adapter.head_dim
    acc_dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)

    def hook(li: int, kind: int):
        def pre(_mod, args):
            x = args[0]
            m = masks[li][kind]
            full = m.repeat_interleave(d, dim=1) if kind == 0 else m
            if x.dim() == 2 and x.shape[0] != full.shape[0]:  # tokens flattened (OPT's FFN): a row per token
                full = full.repeat_interleave(x.shape[0] // full.shape[0], dim=0)
            shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
            return ((x.to(full.dtype) * full.view(shape)).to(x.dtype),)

        return pre

    handles = []
    for li, layer in enumerate(layers):
        handles.append(layer.get_submodule(fam.o).register_forward_pre_hook(hook(li, 0)))
        handles.append(layer.get_submodule(fam.ffn_out).register_forward_pre_hook(hook(li, 1)))
    was_training = model.training
    model.eval()
    try:
        with _frozen(model, []), _checkpointed(layers, checkpointing), torch.enable_grad():
            for batch in batches:
                b = len(batch)
                leaves = []
                for li in range(n_layers):
                    masks[li] = [
                        torch.ones(b, n, dtype=acc_dtype, device=device, requires_grad=True)
                        for n in (adapter.n_heads, adapter.n_neurons)
                    ]
                    leaves += masks[li]
                loss = _per_sample_loss(model, adapter, batch, device).sum()
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
                for li in range(n_layers):
                    for kind in (0, 1):
                        g = grads[2 * li + kind]
                        g = torch.zeros_like(masks[li][kind]) if g is None else g.detach()
                        sums[li][kind] += g.sum(0, dtype=torch.float64)
                        sqs[li][kind] += (g.double() * g.double()).sum(0)
                        if keep_samples:
                            samples[li][kind].append(g.cpu())
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = []
    for li in range(n_layers):
        out.append(
            MaskGrads(
                heads_sum=sums[li][0].cpu(),
                heads_sq=sqs[li][0].cpu(),
                neurons_sum=sums[li][1].cpu(),
                neurons_sq=sqs[li][1].cpu(),
                heads_samples=torch.cat(samples[li][0]) if keep_samples else None,
                neurons_samples=torch.cat(samples[li][1]) if keep_samples else None,
            )
        )
    return out


def prunable_weights(layer: nn.Module, adapter: Adapter) -> dict[str, nn.Parameter]:
    """The weights of a block that head / neuron pruning slices, by path."""
    fam = adapter.family
    paths = (fam.q, fam.k, fam.v, fam.o, *fam.ffn_in, fam.ffn_out)
    return {p: layer.get_submodule(p).weight for p in paths}


@dataclass
class WeightGrads:
    """Per-layer float32 gradient accumulators of the prunable weights, by path."""

    grad: dict[str, torch.Tensor]  # Σ over batches of ∂(mean loss)/∂W
    sq: dict[str, torch.Tensor] | None = None  # Σ_i (∂L_i/∂W)² / n   (per-sample, second order)


def weight_gradients(
    model: nn.Module,
    adapter: Adapter,
    batches: list[CalibrationBatch],
    *,
    second_order: bool = False,
    checkpointing: bool = False,
) -> list[WeightGrads]:
    """Gradient of the mean per-sample loss w.r.t. each prunable weight (float32); with
    ``second_order`` also the mean of per-sample squared gradients (one backward per sample)."""
    device = next(model.parameters()).device
    layers = adapter.layers(model)
    per_layer = [prunable_weights(layer, adapter) for layer in layers]
    params = [w for ws in per_layer for w in ws.values()]
    acc = {id(w): torch.zeros(w.shape, dtype=torch.float32, device=device) for w in params}
    sq = {id(w): torch.zeros(w.shape, dtype=torch.float32, device=device) for w in params} if second_order else None
    n_total = sum(len(b) for b in batches)
    per_sample = [0]  # 1 while a single-sample backward runs (its square is accumulated)

    def move(p: torch.Tensor) -> None:
        g = p.grad.float()
        acc[id(p)] += g
        if per_sample[0]:
            sq[id(p)] += g * g * n_total  # g is ∂(L_i / n)/∂W: n·g² = (∂L_i/∂W)² / n
        p.grad = None

    handles = [w.register_post_accumulate_grad_hook(move) for w in params]
    was_training = model.training
    model.eval()
    try:
        with _frozen(model, params), _checkpointed(layers, checkpointing), torch.enable_grad():
            for batch in batches:
                chunks = [batch.slice(i, i + 1) for i in range(len(batch))] if second_order else [batch]
                per_sample[0] = int(second_order)
                for chunk in chunks:
                    loss = _per_sample_loss(model, adapter, chunk, device).sum() / n_total
                    loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return [
        WeightGrads(
            grad={p: acc[id(w)] for p, w in ws.items()},
            sq=None if sq is None else {p: sq[id(w)] for p, w in ws.items()},
        )
        for ws in per_layer
    ]
