"""Reconstruction of a pruned linear layer from input statistics (pure tensor maths).

Notation of the paper (LIAR, Sec. 4 and Algorithm 1): the layer computes ``X W + B`` with X of shape
(n, C_in) and W of shape (C_in, C_out) (= ``Linear.weight.T``). ``u`` are the kept input channels,
``m`` the pruned ones, ``μ = s / n`` the input mean. Every method returns the new weight in torch
layout ``(C_out, C_u)`` and the new bias ``(C_out,)`` (or None when it leaves a bias-free layer alone).

    none         W' = W_u,                         B' = B
    bias         W' = W_u,                         B' = B + μ_m W_m                      (FLAP)
    liar         Q  = G_uu⁻¹ (G_um − n μ_uᵀ μ_m)    (paper Eq. 5, via the normal equations)
                 P W_u = W_m Π, Π the projector on the row space of W_u   (Eq. 6: P = argmin ‖W_m − P W_u‖)
                 W' = (I + Q P) W_u,               B' = B + μ_m W_m                      (Eq. 8)
    ls           the exact affine least-squares refit  min ‖X W + B − X_u W' − B'‖ :
                 Q_c = Σ_uu⁻¹ Σ_um (centred scatter),  W' = W_u + Q_c W_m,  B' = B + (μ_m − μ_u Q_c) W_m
    mask_tuning  per-group scales α (Kwon et al. 2022):  min_α ‖X W − Σ_g α_g X_g W_g‖² + λ‖α − 1‖²

Solves are Cholesky factorisations in float64 with damping ``λ = damp · mean(diag)``; dead channels
(zero diagonal) get a unit diagonal. ``torch.linalg.lstsq`` in float32 has been seen to return wrong
answers on damped Gram matrices of size 11008, so it is not used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from core.stats.accumulate import InputStats

SOLVE_PRECISION = torch.float64
MASK_TUNING_RANGE = (-10.0, 10.0)  # acceptable range of tuned scales, as in Kwon et al.

Method = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
METHODS: dict[str, Method] = {}


def register(name: str) -> Callable[[Method], Method]:
    def deco(fn: Method) -> Method:
        METHODS[name] = fn
        return fn

    return deco


def solve_spd(matrix: torch.Tensor, rhs: torch.Tensor, damp: float = 0.0) -> torch.Tensor:
    """Solve ``(M + λI) X = R`` for symmetric positive (semi-)definite M by Cholesky.

    ``λ = damp · mean(diag M)``. Zero diagonal entries (dead channels) are set to 1. If the
    factorisation fails, the damping is raised tenfold (starting at 1e-10 relative) with a warning,
    and as a last resort the minimum-norm solution is taken from an eigendecomposition.
    """
    m = matrix.to(SOLVE_PRECISION).clone()
    r = rhs.to(SOLVE_PRECISION)
    diag = m.diagonal()
    dead = diag <= 0
    diag[dead] = 1.0
    if dead.any():
        m[dead, :] = 0.0
        m[:, dead] = 0.0
        m.diagonal()[dead] = 1.0
    scale = diag.mean().clamp_min(torch.finfo(SOLVE_PRECISION).tiny)
    lam = damp * scale
    for _ in range(8):
        chol, info = torch.linalg.cholesky_ex(m + lam * torch.eye(len(m), dtype=m.dtype, device=m.device))
        if int(info) == 0:
            return torch.cholesky_solve(r, chol)
        new_lam = max(float(lam) * 10.0, 1e-10 * float(scale))
        warnings.warn(
            f"Cholesky failed (matrix {len(m)}×{len(m)} not positive definite at damping "
            f"{float(lam / scale):.1e}); retrying with damping {new_lam / float(scale):.1e}",
            RuntimeWarning,
            stacklevel=2,
        )
        lam = torch.as_tensor(new_lam, dtype=m.dtype, device=m.device)
    evals, evecs = torch.linalg.eigh(m)
    keep = evals > evals.max() * len(m) * torch.finfo(m.dtype).eps
    inv = torch.where(keep, 1.0 / evals.clamp_min(torch.finfo(m.dtype).tiny), torch.zeros_like(evals))
    return evecs @ (inv[:, None] * (evecs.T @ r))


def project_rows(target: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Orthogonal projection of the rows of ``target`` (k, d) onto the row space of ``basis`` (r, d).

    Equals ``P basis`` for ``P = argmin ‖target − P basis‖`` (unique even where P is not).
    Works on the smaller of the two Gram matrices of ``basis``.
    """
    r, d = basis.shape
    small = basis @ basis.T if r <= d else basis.T @ basis
    evals, evecs = torch.linalg.eigh(small)
    keep = evals > evals.max().clamp_min(0) * max(r, d) * torch.finfo(evals.dtype).eps
    v = evecs[:, keep]
    if r <= d:  # row space spanned by basisᵀ v / sqrt(λ)
        u = (basis.T @ v) / evals[keep].sqrt()
    else:
        u = v
    return (target @ u) @ u.T


def _split(weight: torch.Tensor, keep: torch.Tensor, stats: InputStats):
    w = weight.to(SOLVE_PRECISION)
    g = stats.gram.to(SOLVE_PRECISION)
    mu = stats.mean.to(SOLVE_PRECISION)
    u, m = keep, ~keep
    return w, g, mu, u, m


def _bias_plus(bias: torch.Tensor | None, delta: torch.Tensor) -> torch.Tensor:
    return delta if bias is None else bias.to(SOLVE_PRECISION) + delta


@register("none")
def _none(weight, bias, keep, stats, damp=0.0, group_size=1):
    return weight.to(SOLVE_PRECISION)[:, keep], None if bias is None else bias.to(SOLVE_PRECISION)


@register("bias")
def _bias(weight, bias, keep, stats, damp=0.0, group_size=1):
    w, _, mu, u, m = _split(weight, keep, stats)
    return w[:, u], _bias_plus(bias, w[:, m] @ mu[m])


@register("liar")
def _liar(weight, bias, keep, stats, damp=0.0, group_size=1):
    w, g, mu, u, m = _split(weight, keep, stats)
    n = stats.count
    rhs = g[u][:, m] - n * torch.outer(mu[u], mu[m])
    q = solve_spd(g[u][:, u], rhs, damp)  # (C_u, C_m)
    w_u, w_m = w[:, u].T, w[:, m].T  # paper layout (C, C_out)
    pw_u = project_rows(w_m, w_u)  # P W_u, (C_m, C_out)
    new_w = w_u + q @ pw_u
    return new_w.T, _bias_plus(bias, w[:, m] @ mu[m])


@register("ls")
def _ls(weight, bias, keep, stats, damp=0.0, group_size=1):
    w, g, mu, u, m = _split(weight, keep, stats)
    n = stats.count
    cov_uu = g[u][:, u] - n * torch.outer(mu[u], mu[u])
    cov_um = g[u][:, m] - n * torch.outer(mu[u], mu[m])
    qc = solve_spd(cov_uu, cov_um, damp)  # (C_u, C_m)
    w_m = w[:, m].T  # (C_m, C_out)
    new_w = w[:, u].T + qc @ w_m
    return new_w.T, _bias_plus(bias, (mu[m] - mu[u] @ qc) @ w_m)


@register("mask_tuning")
def _mask_tuning(weight, bias, keep, stats, damp=0.0, group_size=1):
    """Scales per kept group of ``group_size`` consecutive channels (a head, or a single neuron)."""
    w, g, _, u, _ = _split(weight, keep, stats)
    c_in = w.shape[1]
    if c_in % group_size:
        raise ValueError(f"{c_in} input channels do not split into groups of {group_size}")
    kept_idx = u.nonzero().squeeze(1)
    group_of = kept_idx // group_size
    groups, inverse = torch.unique(group_of, return_inverse=True)
    onehot = torch.zeros(len(kept_idx), len(groups), dtype=w.dtype, device=w.device)
    onehot[torch.arange(len(kept_idx)), inverse] = 1.0
    e_u = (w[:, u].T @ w) * g[u]  # (C_u, C_in): (WᵀW ∘ G) rows of kept channels
    a = onehot.T @ e_u[:, u] @ onehot  # (n_groups, n_groups)
    b = onehot.T @ e_u.sum(1)  # (n_groups,)
    ones = torch.ones(len(groups), dtype=w.dtype, device=w.device)
    delta = solve_spd(a, (b - a @ ones)[:, None], damp).squeeze(1)
    alpha = (ones + delta).clamp(*MASK_TUNING_RANGE)
    new_w = w[:, u] * (onehot @ alpha)[None, :]
    return new_w, None if bias is None else bias.to(SOLVE_PRECISION)


def reconstruct_from_stats(
    method: str,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    stats: InputStats,
    damp: float = 0.0,
    group_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch to a registered method. Results are float64 (SOLVE_PRECISION)."""
    if method not in METHODS:
        raise ValueError(f"unknown reconstruction method {method!r}; choose one of {sorted(METHODS)}")
    keep = torch.as_tensor(keep, dtype=torch.bool, device=weight.device)
    if keep.shape != (weight.shape[1],):
        raise ValueError(f"keep must be a bool tensor of shape ({weight.shape[1]},), got {tuple(keep.shape)}")
    if not keep.any():
        raise ValueError("keep selects no input channel")
    if damp < 0:
        raise ValueError(f"damp must be >= 0, got {damp}")
    if keep.all() or method == "none":
        return METHODS["none"](weight, bias, keep, stats)
    return METHODS[method](weight, bias, keep, stats, damp=damp, group_size=group_size)


def reconstruct_linear(
    method: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    damp: float = 0.0,
    group_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reconstruct one pruned linear layer from raw inputs.

    ``x`` (n, C_in), ``weight`` (C_out, C_in) (torch Linear layout), ``bias`` (C_out,) or None,
    ``keep`` bool (C_in,). Returns ``(new_weight (C_out, n_kept), new_bias (C_out,))`` in the dtype of
    ``weight``; ``new_bias`` is zeros where the layer had no bias and the method adds none.
    """
    if x.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be (n, {weight.shape[1]}), got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError("x holds no tokens")
    stats = InputStats.from_tensor(x, dtype=SOLVE_PRECISION)
    new_w, new_b = reconstruct_from_stats(method, weight, bias, keep, stats, damp, group_size)
    if new_b is None:
        new_b = torch.zeros(weight.shape[0], dtype=SOLVE_PRECISION, device=weight.device)
    return new_w.to(weight.dtype), new_b.to(weight.dtype)


def relative_output_errors(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    candidates: list[tuple[torch.Tensor, torch.Tensor | None]],
    stats: InputStats,
) -> list[float]:
    """‖X W + B − (X_u W' + B')‖² / ‖X W + B‖² for each candidate ``(W', B')``, over ``stats``' tokens.

    Closed form from G, s, n: ‖XΔᵀ + 1δᵀ‖² = tr(Δ G Δᵀ) + 2 δᵀ Δ s + n ‖δ‖².
    """
    w = weight.to(SOLVE_PRECISION)
    g, s, n = stats.gram.to(SOLVE_PRECISION), stats.sum.to(SOLVE_PRECISION), stats.count
    zeros = torch.zeros(w.shape[0], dtype=SOLVE_PRECISION, device=w.device)
    b = zeros if bias is None else bias.to(SOLVE_PRECISION)

    def sq_norm(d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return ((d @ g) * d).sum() + 2 * c @ (d @ s) + n * (c @ c)

    den = float(sq_norm(w, b))
    out = []
    for new_weight, new_bias in candidates:
        delta = w.clone()
        delta[:, keep] -= new_weight.to(SOLVE_PRECISION)
        b_new = zeros if new_bias is None else new_bias.to(SOLVE_PRECISION)
        out.append(float(sq_norm(delta, b - b_new)) / den if den > 0 else 0.0)
    return out


def relative_output_error(weight, bias, keep, new_weight, new_bias, stats: InputStats) -> float:
    """:func:`relative_output_errors` for one candidate."""
    return relative_output_errors(weight, bias, keep, [(new_weight, new_bias)], stats)[0]
