"""Pruning criteria: an importance score per attention head and per FFN neuron (higher = keep).

Each criterion is a function ``(layer, adapter, options) -> Scores`` registered by name. Scores
index the layer's *original* query heads and neurons.

- ``magnitude``: the paper's adapted L2 metric (Appendix C):  s_k = Σ_i ‖W_{k,i}‖² over the rows of
  the output projection W (C_in, C_out) that belong to unit k — one row for an FFN neuron (in
  ``down_proj`` / BERT ``output.dense``), the ``head_dim`` rows of a head in ``o_proj``.
- ``random``: uniform random scores (seeded), a floor for comparisons.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core.adapters import Adapter


@dataclass
class Scores:
    heads: torch.Tensor  # (n_heads,)
    neurons: torch.Tensor  # (n_neurons,)


Criterion = Callable[[nn.Module, Adapter, int, dict[str, Any]], Scores]
CRITERIA: dict[str, Criterion] = {}


def register(name: str) -> Callable[[Criterion], Criterion]:
    def deco(fn: Criterion) -> Criterion:
        CRITERIA[name] = fn
        return fn

    return deco


def _check_options(name: str, options: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"criterion {name!r} has no option(s) {sorted(unknown)}; allowed: {sorted(allowed) or 'none'}")


@register("magnitude")
@torch.no_grad()
def magnitude(layer: nn.Module, adapter: Adapter, layer_idx: int, options: dict[str, Any]) -> Scores:
    _check_options("magnitude", options, set())
    fam = adapter.family
    col_sq = lambda path: layer.get_submodule(path).weight.float().pow(2).sum(0)  # noqa: E731
    heads = col_sq(fam.o).reshape(adapter.n_heads, adapter.head_dim).sum(1)
    return Scores(heads=heads.cpu(), neurons=col_sq(fam.ffn_out).cpu())


@register("random")
def random(layer: nn.Module, adapter: Adapter, layer_idx: int, options: dict[str, Any]) -> Scores:
    _check_options("random", options, {"seed"})
    gen = torch.Generator().manual_seed(int(options.get("seed", 0)) * 100_003 + layer_idx)
    return Scores(
        heads=torch.rand(adapter.n_heads, generator=gen),
        neurons=torch.rand(adapter.n_neurons, generator=gen),
    )
