"""The paper's adapted L2 magnitude (Appendix C): s_k = Σ_i ‖W_{k,i}‖² over the rows of the output
projection W (C_in, C_out) that belong to unit k — one row for an FFN neuron (in ``down_proj`` /
BERT ``output.dense``), the ``head_dim`` rows of a head in ``o_proj``."""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, register
from core.models.adapter import Adapter


@register
class Magnitude(Criterion):
    name = "magnitude"
    reads = ("o", "ffn_out")

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        fam = adapter.family
        col_sq = lambda path: layer.get_submodule(path).weight.float().pow(2).sum(0)  # noqa: E731
        heads = col_sq(fam.o).reshape(adapter.n_heads, adapter.head_dim).sum(1)
        return Scores(heads=heads.cpu(), neurons=col_sq(fam.ffn_out).cpu())
