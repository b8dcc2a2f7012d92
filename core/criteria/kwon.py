"""Kwon et al. (2022): the diagonal of the empirical Fisher information of the head / neuron masks,
I_k = Σ_i (∂L_i/∂m_k)² over calibration samples i. With ``allocation: global`` the budget is spread
by their mask search (``global_search = "fisher"``, in :mod:`core.allocation`); with ``rearrange``
(default) each layer's kept set is then re-chosen with the layer's full (block-diagonal) Fisher
matrix from the per-sample gradients."""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter


@register
class Kwon(Criterion):
    name = "kwon"
    needs = "gradients"
    gradients = "mask"
    global_search = "fisher"

    def gradient_flag(self, opts) -> bool:
        return bool(opts.rearrange)

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        grads = needs_data(data, "kwon")
        return Scores(
            heads=grads.heads_sq,
            neurons=grads.neurons_sq,
            head_samples=grads.heads_samples if opts.rearrange else None,
            neuron_samples=grads.neurons_samples if opts.rearrange else None,
        )
