"""LLM-Pruner's first-order Taylor importance (Ma et al. 2023) of each coupled group.

Per weight element: ``s = W ⊙ ∇W`` (``param_first``, default), ``W ⊙ H_diag ⊙ W`` with the
diagonal Hessian approximated by the mean per-sample squared gradient (``param_second``), or
their mix ``s1 − ½ s2`` (``param_mix``). Per channel: Σ|s| over the channel's weights, or |Σ s|
for ``vectorize``. A head's group is its q rows, its key/value head's k and v rows (shared by
``n_rep`` query heads under GQA, so each gets 1/n_rep of them) and its o_proj columns; a neuron's
group is its gate/up rows and its down_proj column. Components are aggregated channel by channel
(``sum`` default, ``prod``, ``max``, ``last``) and summed over a head's channels.
``attention_layers`` / ``mlp_layers`` = [start, end) restrict which layers are pruned at all.
"""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter
from core.spec.criteria import layer_span


def _taylor_salience(mode: str, w: torch.Tensor, g: torch.Tensor, sq: torch.Tensor | None) -> torch.Tensor:
    w = w.detach().float()
    first = w * g
    if mode in ("param_first", "vectorize"):
        return first
    second = w * sq * w
    return second if mode == "param_second" else first - 0.5 * second


def _channel_importance(mode: str, salience: torch.Tensor, dim: int) -> torch.Tensor:
    """Per output row (``dim=1``) or input column (``dim=0``): |Σ s| (vectorize) or Σ |s|."""
    return salience.sum(dim).abs() if mode == "vectorize" else salience.abs().sum(dim)


def _aggregate(parts: list[torch.Tensor], how: str) -> torch.Tensor:
    stacked = torch.stack(parts)
    if how == "sum":
        return stacked.sum(0)
    if how == "prod":
        return stacked.prod(0)
    if how == "max":
        return stacked.max(0).values
    return stacked[-1]  # "last": the group's last executed projection (o_proj / down_proj)


@register
class Taylor(Criterion):
    name = "taylor"
    needs = "gradients"
    gradients = "weight"

    def gradient_flag(self, opts) -> bool:
        return opts.second_order

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        grads = needs_data(data, "taylor")
        mode, how = opts.taylor, opts.aggregation
        fam, d, n_rep = adapter.family, adapter.head_dim, adapter.n_rep if adapter.family.gqa else 1

        def channels(path: str, dim: int) -> torch.Tensor:
            w = layer.get_submodule(path).weight
            sq = None if grads.sq is None else grads.sq[path]
            return _channel_importance(mode, _taylor_salience(mode, w, grads.grad[path], sq), dim)

        blocks = adapter.row_blocks()
        (q_path, q_rows), (k_path, k_rows), (v_path, v_rows) = blocks["q"][0], blocks["k"][0], blocks["v"][0]
        q = channels(q_path, 1)[q_rows].reshape(adapter.n_heads, d)
        kv_index = torch.arange(adapter.n_heads) // n_rep
        k = channels(k_path, 1)[k_rows].reshape(-1, d)[kv_index] / n_rep
        v = channels(v_path, 1)[v_rows].reshape(-1, d)[kv_index] / n_rep
        o = channels(fam.o, 0).reshape(adapter.n_heads, d)
        heads = _aggregate([q, k, v, o], how).sum(1)
        ffn_in = [channels(path, 1)[rows] for path, rows in blocks["ffn_in"]]
        neurons = _aggregate(ffn_in + [channels(fam.ffn_out, 0)], how)
        n_layers = adapter.n_layers
        return Scores(
            heads=heads.cpu(),
            neurons=neurons.cpu(),
            prunable_heads=layer_idx in layer_span(opts.attention_layers, "attention_layers", n_layers),
            prunable_neurons=layer_idx in layer_span(opts.mlp_layers, "mlp_layers", n_layers),
        )
