"""Uniform random scores (seeded per layer): the floor every other criterion is compared with."""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, register
from core.models.adapter import Adapter


@register
class Random(Criterion):
    name = "random"
    reads = ()  # shapes only: nothing is read

    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        gen = torch.Generator().manual_seed(int(opts.seed) * 100_003 + layer_idx)
        return Scores(
            heads=torch.rand(adapter.n_heads, generator=gen),
            neurons=torch.rand(adapter.n_neurons, generator=gen),
        )
