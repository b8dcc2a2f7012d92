"""Error feedback: refit a pruned layer to the *dense model's* outputs, not its own.

The paper's reconstruction (and ``ls``) fits ``X_u W' + B' ≈ X W + B`` where X are the layer's inputs
in the pruned model: the layer replaces what *it* would have computed on the inputs it now receives,
and the errors of the blocks before it stay. With error feedback the target is the dense model's
output ``X_d W + B`` (X_d: the same projection's inputs in the dense model, on the same tokens), so
each layer also undoes what the pruned layers before it changed (as asymmetric calibration does for
quantisation). The exact affine least-squares solution needs, beside the Gram of the pruned inputs,
their cross products with the dense inputs:

    Σ_pp = X_pᵀX_p − n μ_p μ_pᵀ,   Σ_pd = X_pᵀX_d − n μ_p μ_dᵀ
    W'ᵀ  = (Σ_pp,uu + λI)⁻¹ Σ_pd,u: Wᵀ,   B' = B + μ_d Wᵀ − μ_p,u W'ᵀ

All statistics are float64 sums over the calibration tokens (products in the configured precision);
the dense inputs' own Gram is kept for the error report.
"""

from __future__ import annotations

from functools import partial

import torch

from core.stats.accumulate import InputStats, flush_tokens, gram_product
from core.stats.reconstruct import _block, centred_block
from core.stats.spd_inverse import SOLVE_PRECISION, solve_spd_in_place


class TargetStats:
    """Streams pairs ``(X_p, X_d)`` of a projection's inputs in the pruned and in the dense model:
    the pruned inputs' Gram and sum, the dense inputs' sum, the cross products — and, only with
    ``dense_gram`` (errors from statistics, when no samples are held aside), the dense inputs' Gram."""

    def __init__(
        self, c_in: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu", dense_gram: bool = True
    ):
        self.pruned = InputStats(c_in, dtype, device)
        self.dense = InputStats(c_in, dtype, device) if dense_gram else None
        self.dtype = dtype
        self.cross = torch.zeros(c_in, c_in, dtype=torch.float64, device=device)  # X_pᵀ X_d
        self._dense_sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._buffered = 0

    @property
    def count(self) -> int:
        return self.pruned.count

    @torch.no_grad()
    def add_pair(self, x_p: torch.Tensor, x_d: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add the inputs of one batch in the pruned model (``x_p``) and in the dense one (``x_d``)."""
        if x_p.shape != x_d.shape:
            raise ValueError(f"pruned and dense inputs differ in shape: {tuple(x_p.shape)} vs {tuple(x_d.shape)}")
        c = x_p.shape[-1]
        a, b = x_p.detach().reshape(-1, c), x_d.detach().reshape(-1, c)
        if mask is not None:  # real tokens only, selected once for every statistic
            keep = mask.reshape(-1).to(a.device)
            a, b = a[keep], b[keep]
        self.pruned.add_batch(a)
        if self.dense is not None:
            self.dense.add_batch(b)
        self._pairs.append((a, b))
        self._buffered += len(a)
        if self._buffered >= flush_tokens(a):
            self._flush()

    def _flush(self) -> None:
        if self._pairs:
            a = torch.cat([p for p, _ in self._pairs]).to(self.cross.device)
            b = torch.cat([d for _, d in self._pairs]).to(self.cross.device)
            self.cross += gram_product(a, b, self.dtype)
            self._dense_sum += b.sum(0, dtype=torch.float64)
        self._pairs, self._buffered = [], 0

    def cross_products(self) -> torch.Tensor:
        self._flush()
        return self.cross

    @property
    def dense_sum(self) -> torch.Tensor:
        self._flush()
        return self._dense_sum


def refit_to_dense(
    weight: torch.Tensor, bias: torch.Tensor | None, keep: torch.Tensor, stats: TargetStats, damp: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact affine least-squares ``(W', B')`` of the kept channels' pruned inputs onto the dense
    outputs (torch layout: ``W'`` is ``(C_out, C_u)``)."""
    n = stats.count
    u = keep.nonzero().squeeze(1)
    mu_p = stats.pruned.sum.to(SOLVE_PRECISION) / n
    mu_d = stats.dense_sum.to(SOLVE_PRECISION) / n
    cov_ud = stats.cross_products().to(SOLVE_PRECISION).index_select(0, u).addr_(mu_p[u], mu_d, alpha=-n)
    w = weight.to(SOLVE_PRECISION)
    rhs = cov_ud @ w.T  # (C_u, C_out)
    del cov_ud
    cov_uu = partial(centred_block, stats.pruned.gram.to(SOLVE_PRECISION), mu_p, n, u, u)
    new_wt = solve_spd_in_place(cov_uu, rhs, damp)  # (C_u, C_out)
    b = torch.zeros(w.shape[0], dtype=SOLVE_PRECISION, device=w.device) if bias is None else bias.to(SOLVE_PRECISION)
    return new_wt.T, b + w @ mu_d - mu_p[u] @ new_wt


def relative_errors_to_dense(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    candidates: list[tuple[torch.Tensor, torch.Tensor | None]],
    stats: TargetStats,
) -> list[torch.Tensor]:
    """‖X_d W + B − (X_p,u W' + B')‖² / ‖X_d W + B‖² per candidate, from the statistics (float64; needs
    ``dense_gram``). On raw held-aside inputs: ``relative_output_error_from_inputs(..., x_ref=X_d)``."""
    n = stats.count
    u = keep.nonzero().squeeze(1)
    w = weight.to(SOLVE_PRECISION)
    b = torch.zeros(w.shape[0], dtype=SOLVE_PRECISION, device=w.device) if bias is None else bias.to(SOLVE_PRECISION)
    g_uu = _block(stats.pruned.gram.to(SOLVE_PRECISION), u, u)
    g_dd = stats.dense.gram.to(SOLVE_PRECISION)
    g_ud = stats.cross_products().to(SOLVE_PRECISION).index_select(0, u)
    s_u, s_d = stats.pruned.sum.to(SOLVE_PRECISION)[u], stats.dense_sum.to(SOLVE_PRECISION)
    target_sq = ((w @ g_dd) * w).sum()  # ‖X_d Wᵀ‖²
    ws_d = w @ s_d
    den = target_sq + 2 * b @ ws_d + n * (b @ b)
    out = []
    for new_weight, new_bias in candidates:
        e = new_weight.to(SOLVE_PRECISION)
        nb = b if new_bias is None else new_bias.to(SOLVE_PRECISION)
        delta = nb - b
        quad = ((e @ g_uu) * e).sum() + target_sq - 2 * ((e @ g_ud) * w).sum()
        num = quad + 2 * delta @ (e @ s_u - ws_d) + n * (delta @ delta)
        out.append(torch.where(den > 0, num.clamp_min(0) / den, torch.zeros_like(den)))
    return out
