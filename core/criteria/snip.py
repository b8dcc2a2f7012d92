"""SNIP (Lee et al. 2019) on structure masks: |g_k| with g_k = ∂L/∂c_k at c = 1 over the whole
calibration set, normalised by Σ_j |g_j| over all units of the same kind in the network, as the
paper's appendix defines."""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter


@register
class Snip(Criterion):
    name = "snip"
    needs = "gradients"
    gradients = "mask"

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        grads = needs_data(data, "snip")
        return Scores(heads=grads.heads_sum.abs(), neurons=grads.neurons_sum.abs())

    def finalize(self, scores: list[Scores], opts) -> list[Scores]:
        total_h = sum(float(s.heads.sum()) for s in scores) or 1.0
        total_n = sum(float(s.neurons.sum()) for s in scores) or 1.0
        for s in scores:
            s.heads, s.neurons = s.heads / total_h, s.neurons / total_n
        return scores
