"""KCM (Nova et al. 2023), FFN neurons only, no labels and no gradients.

R2 (representative ranking): :func:`kcm_r2` on each neuron's output weights (its column of
``down_proj``), Gaussian kernel width σ = 1, rate α = 0.01. D2 (data-driven): the neuron's mean
activation (the input of ``down_proj``) over the calibration tokens, z-score normalised within
the layer. Combined as R2 × D2 (``combine: product``, default) or by the sum of their ranks
(``combine: rank``).
"""

from __future__ import annotations

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter


def gaussian_kernel(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """K_ij = exp(−‖x_i − x_j‖² / σ²) between the rows of ``x``."""
    sq = (x * x).sum(1)
    dist = (sq[:, None] + sq[None, :] - 2 * x @ x.T).clamp_min(0)
    return torch.exp(-dist / sigma**2)


def kcm_r2(features: torch.Tensor, sigma: float = 1.0, alpha: float = 0.01, max_iter: int = 1000) -> torch.Tensor:
    """KCM's Representative Ranking: kernelised convex-hull coefficients C ≥ 0 minimising
    ‖φ(X) − φ(X) C‖² by the multiplicative update C ← C ⊙ sqrt(K / (K C)) from C = 1/N, stopped
    when |Σ (C_new − C)| / Σ |C| < α; a neuron's score is its self-coefficient C_kk (how much it is
    needed to represent itself — small when others represent it)."""
    x = features.detach().to(torch.float64)
    n = x.shape[0]
    k = gaussian_kernel(x, sigma)
    c = torch.full((n, n), 1.0 / n, dtype=torch.float64, device=x.device)
    for _ in range(max_iter):
        new = c * torch.sqrt(k / (k @ c))
        diff = float((new - c).sum().abs() / c.abs().sum())
        c = new
        if diff < alpha:
            break
    return torch.diagonal(c).clone()


def _zscore(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / x.std().clamp_min(1e-12)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """0 = smallest; ties broken by index (stable)."""
    r = torch.empty_like(x)
    r[torch.argsort(x, stable=True)] = torch.arange(len(x), dtype=x.dtype, device=x.device)
    return r


@register
class Kcm(Criterion):
    name = "kcm"
    needs = "inputs"

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        inputs = needs_data(data, "kcm")
        w = layer.get_submodule(adapter.family.ffn_out).weight  # (hidden, n_neurons)
        r2 = kcm_r2(w.T, float(opts.sigma), float(opts.alpha), int(opts.max_iter))
        d2 = _zscore(inputs.ffn.mean.to(torch.float64))
        neurons = r2 * d2 if opts.combine == "product" else _ranks(r2) + _ranks(d2)
        return Scores(heads=torch.zeros(adapter.n_heads), neurons=neurons.float().cpu(), prunable_heads=False)
