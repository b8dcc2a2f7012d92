"""FLAP (An et al. 2024): fluctuation metrics of the projection inputs.

Computed from per-channel statistics of the inputs of
``o_proj`` / ``down_proj`` on the dense model (as FLAP, which propagates the dense outputs):
``IFV_k = Var(X_k)``, ``WIFV_k = Var(X_k) · ‖W_:,k‖²`` (default), ``WIFN_k = mean_j |W_jk| · ‖X_k‖_rms``.
Heads use the square of the channel metric; structure ``UL-UM`` (uniform per layer) sums it over a
head's channels, ``AL-AM`` (adaptive across layers and modules) standardises each layer's channel
metrics, averages them per head, and ranks heads and neurons together by one global threshold
with each unit weighted by the parameters it removes (needs ``allocation: global``).
Variances are exact (sample variance from streamed count / sum / sum of squares in float64);
FLAP's public streaming update aliases the old and new means and drops the first batch.
"""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter
from core.stats.accumulate import ChannelStats


def flap_channel_metric(metric: str, weight: torch.Tensor, stats: ChannelStats) -> torch.Tensor:
    """FLAP's per-input-channel fluctuation metric for a projection ``weight`` (C_out, C_in)."""
    w = weight.detach().to(torch.float64)
    if metric == "IFV":
        return stats.variance
    if metric == "WIFV":
        return stats.variance * w.pow(2).sum(0)
    if metric == "WIFN":
        return (w.abs() * stats.mean_square.sqrt()[None, :]).mean(0)
    raise ValueError(f"unknown FLAP metric {metric!r}")


def _standardise(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / x.std()


@register
class Flap(Criterion):
    name = "flap"
    needs = "inputs"

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        inputs = needs_data(data, "flap")
        fam = adapter.family
        attn = flap_channel_metric(opts.metric, layer.get_submodule(fam.o).weight, inputs.attn) ** 2
        ffn = flap_channel_metric(opts.metric, layer.get_submodule(fam.ffn_out).weight, inputs.ffn)
        if opts.structure == "UL-UM":
            heads = attn.reshape(adapter.n_heads, adapter.head_dim).sum(1)
            return Scores(heads=heads.float().cpu(), neurons=ffn.float().cpu())
        heads = _standardise(attn).reshape(adapter.n_heads, adapter.head_dim).mean(1)
        return Scores(heads=heads.float().cpu(), neurons=_standardise(ffn).float().cpu(), comparable=True)
