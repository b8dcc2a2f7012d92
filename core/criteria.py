"""Pruning criteria: an importance score per attention head and per FFN neuron (higher = keep).

Each criterion is a function ``(layer, adapter, options) -> Scores`` registered by name. Scores
index the layer's *original* query heads and neurons.

- ``magnitude``: the paper's adapted L2 metric (Appendix C):  s_k = Σ_i ‖W_{k,i}‖² over the rows of
  the output projection W (C_in, C_out) that belong to unit k — one row for an FFN neuron (in
  ``down_proj`` / BERT ``output.dense``), the ``head_dim`` rows of a head in ``o_proj``.
- ``random``: uniform random scores (seeded), a floor for comparisons.
- ``flap``: FLAP's fluctuation metrics (An et al. 2024) from per-channel statistics of the inputs of
  ``o_proj`` / ``down_proj`` on the dense model (as FLAP, which propagates the dense outputs):
  ``IFV_k = Var(X_k)``, ``WIFV_k = Var(X_k) · ‖W_:,k‖²`` (default), ``WIFN_k = mean_j |W_jk| · ‖X_k‖_rms``.
  Heads use the square of the channel metric; structure ``UL-UM`` (uniform per layer) sums it over a
  head's channels, ``AL-AM`` (adaptive across layers and modules) standardises each layer's channel
  metrics, averages them per head, and ranks heads and neurons together by one global threshold
  with each unit weighted by the parameters it removes (needs ``allocation: global``).
  Variances are exact (sample variance from streamed count / sum / sum of squares in float64);
  FLAP's public streaming update aliases the old and new means and drops the first batch.

A criterion is ``fn(layer, adapter, layer_idx, options, inputs) -> Scores``, where ``inputs`` is the
layer's :class:`LayerInputs` (per-channel statistics) for criteria listed in ``NEEDS_INPUTS``, else None.
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
    # True when scores are comparable across layers and between heads and neurons (standardised):
    # global allocation then ranks by score, weighting units by their parameters (FLAP's AL-AM);
    # otherwise it ranks by score per parameter removed.
    comparable: bool = False


class ChannelStats:
    """Per-channel count, sum and sum of squares of a projection's input, streamed in float64."""

    def __init__(self, c_in: int, device="cpu"):
        self.count = 0
        self.sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self.sumsq = torch.zeros(c_in, dtype=torch.float64, device=device)

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        x = x.reshape(-1, x.shape[-1])
        if mask is not None:
            x = x[mask.reshape(-1).to(x.device)]
        x = x.to(torch.float64)
        self.count += x.shape[0]
        self.sum += x.sum(0)
        self.sumsq += (x * x).sum(0)

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / self.count

    @property
    def variance(self) -> torch.Tensor:
        """Unbiased sample variance (n − 1)."""
        return ((self.sumsq - self.count * self.mean**2) / max(self.count - 1, 1)).clamp_min(0)

    @property
    def mean_square(self) -> torch.Tensor:
        return self.sumsq / self.count


@dataclass
class LayerInputs:
    attn: ChannelStats  # inputs of the attention output projection
    ffn: ChannelStats  # inputs of the FFN output projection


Criterion = Callable[..., Scores]
CRITERIA: dict[str, Criterion] = {}
NEEDS_INPUTS: set[str] = set()


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
def magnitude(layer: nn.Module, adapter: Adapter, layer_idx: int, options: dict[str, Any], inputs=None) -> Scores:
    _check_options("magnitude", options, set())
    fam = adapter.family
    col_sq = lambda path: layer.get_submodule(path).weight.float().pow(2).sum(0)  # noqa: E731
    heads = col_sq(fam.o).reshape(adapter.n_heads, adapter.head_dim).sum(1)
    return Scores(heads=heads.cpu(), neurons=col_sq(fam.ffn_out).cpu())


@register("random")
def random(layer: nn.Module, adapter: Adapter, layer_idx: int, options: dict[str, Any], inputs=None) -> Scores:
    _check_options("random", options, {"seed"})
    gen = torch.Generator().manual_seed(int(options.get("seed", 0)) * 100_003 + layer_idx)
    return Scores(
        heads=torch.rand(adapter.n_heads, generator=gen),
        neurons=torch.rand(adapter.n_neurons, generator=gen),
    )


FLAP_METRICS = ("IFV", "WIFV", "WIFN")
FLAP_STRUCTURES = ("UL-UM", "AL-AM")


def flap_channel_metric(metric: str, weight: torch.Tensor, stats: ChannelStats) -> torch.Tensor:
    """FLAP's per-input-channel fluctuation metric for a projection ``weight`` (C_out, C_in)."""
    w = weight.detach().to(torch.float64)
    if metric == "IFV":
        return stats.variance
    if metric == "WIFV":
        return stats.variance * w.pow(2).sum(0)
    if metric == "WIFN":
        return (w.abs() * stats.mean_square.sqrt()[None, :]).mean(0)
    raise ValueError(f"unknown FLAP metric {metric!r}; choose one of {FLAP_METRICS}")


def _standardise(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / x.std()


def flap_options(options: dict[str, Any]) -> tuple[str, str]:
    _check_options("flap", options, {"metric", "structure"})
    metric, structure = options.get("metric", "WIFV"), options.get("structure", "UL-UM")
    if metric not in FLAP_METRICS:
        raise ValueError(f"unknown FLAP metric {metric!r}; choose one of {FLAP_METRICS}")
    if structure not in FLAP_STRUCTURES:
        raise ValueError(f"unknown FLAP structure {structure!r}; choose one of {FLAP_STRUCTURES}")
    return metric, structure


@register("flap")
@torch.no_grad()
def flap(layer: nn.Module, adapter: Adapter, layer_idx: int, options: dict[str, Any], inputs=None) -> Scores:
    metric, structure = flap_options(options)
    if inputs is None:
        raise ValueError("the flap criterion needs calibration activations (none were collected)")
    fam = adapter.family
    attn = flap_channel_metric(metric, layer.get_submodule(fam.o).weight, inputs.attn) ** 2
    ffn = flap_channel_metric(metric, layer.get_submodule(fam.ffn_out).weight, inputs.ffn)
    if structure == "UL-UM":
        heads = attn.reshape(adapter.n_heads, adapter.head_dim).sum(1)
        return Scores(heads=heads.float().cpu(), neurons=ffn.float().cpu())
    heads = _standardise(attn).reshape(adapter.n_heads, adapter.head_dim).mean(1)
    return Scores(heads=heads.float().cpu(), neurons=_standardise(ffn).float().cpu(), comparable=True)


NEEDS_INPUTS.add("flap")
