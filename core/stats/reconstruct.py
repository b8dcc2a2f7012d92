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

from collections.abc import Callable
from functools import partial

import torch

from core.stats.accumulate import InputStats, tf32
from core.stats.spd_inverse import SOLVE_PRECISION, solve_factored, solve_spd, solve_spd_in_place

MASK_TUNING_RANGE = (-10.0, 10.0)  # acceptable range of tuned scales, as in Kwon et al.

Method = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
METHODS: dict[str, Method] = {}


def register(name: str) -> Callable[[Method], Method]:
    def deco(fn: Method) -> Method:
        METHODS[name] = fn
        return fn

    return deco


def gram_block(
    make: Callable[[], torch.Tensor], stats: InputStats, release: bool
) -> tuple[Callable[[], torch.Tensor], Callable[[], None] | None]:
    """What :func:`solve_spd_in_place` factorises — ``make()``, a block of the statistics' Gram, made
    again for a retry — and, with ``release``, what it calls once the factorisation has succeeded: the
    statistics are freed there, so the C_in² Gram is alive while the block is factorised (a failed
    factorisation is retried from it) but not during the triangular solves."""
    holder = [make]

    def factored() -> None:
        holder.clear()
        stats.free()

    return (lambda: holder[0]()), (factored if release else None)


def _eigh_projection(target: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Rank-revealing fallback of :func:`project_rows` (an eigendecomposition of the smaller Gram)."""
    r, d = basis.shape
    small = basis @ basis.T if r <= d else basis.T @ basis
    evals, evecs = torch.linalg.eigh(small)
    keep = evals > evals.max().clamp_min(0) * max(r, d) * torch.finfo(evals.dtype).eps
    v = evecs[:, keep]
    u = (basis.T @ v) / evals[keep].sqrt() if r <= d else v  # orthonormal basis of the row space
    return (target @ u) @ u.T


def project_rows(target: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Orthogonal projection of the rows of ``target`` (k, d) onto the row space of ``basis`` (r, d).

    Equals ``P basis`` for ``P = argmin ‖target − P basis‖`` (unique even where P is not). By Cholesky
    factorisations, not eigendecompositions: with ``r ≥ d`` and ``basis`` of full column rank (an
    FFN's kept neurons against its hidden size) the row space is all of R^d and the projection is
    ``target`` itself; with ``r < d`` (attention heads) it is ``(target basisᵀ)(basis basisᵀ)⁻¹ basis``.
    Where the factorisation fails or its pivots span more than ``max(r, d) · eps`` (numerically
    rank-deficient) the eigendecomposition path decides the rank instead, as before.
    """
    r, d = basis.shape
    small = basis.T @ basis if r >= d else basis @ basis.T
    chol, info = torch.linalg.cholesky_ex(small)
    pivots = chol.diagonal() ** 2
    threshold = pivots.max() * max(r, d) * torch.finfo(small.dtype).eps
    if not bool((info == 0) & (pivots.min() > threshold)):  # one read of the device per projection
        return _eigh_projection(target, basis)
    if r >= d:
        return target.clone()
    coeff = solve_factored(chol, (target @ basis.T).T).T  # (k, r)
    return coeff @ basis


def _split(weight: torch.Tensor, keep: torch.Tensor, stats: InputStats, weight_too: bool = True):
    """Float64 weight (None unless ``weight_too``), Gram and mean, and index tensors of the kept (u)
    and pruned (m) channels (index_select instead of boolean masks: one read of the mask, not one
    per use)."""
    w = weight.to(SOLVE_PRECISION) if weight_too else None
    g = stats.gram.to(SOLVE_PRECISION)
    mu = stats.mean.to(SOLVE_PRECISION)
    u = keep.nonzero().squeeze(1)
    m = (~keep).nonzero().squeeze(1)
    return w, g, mu, u, m


def _columns(weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The input channels ``index`` of a torch-layout weight as float64 rows (C, C_out), gathered before
    the cast: no float64 copy of the whole weight (344 MB for LLaMA-7B's down projection)."""
    return weight.index_select(1, index).T.to(SOLVE_PRECISION)


def _block(g: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``g[rows][:, cols]`` in one gather: no (rows × C_in) intermediate (200 MB for an 11008-wide
    FFN's kept rows in float64)."""
    return g[rows[:, None], cols[None, :]]


def centred_block(
    g: torch.Tensor, mu: torch.Tensor, n: int, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None
) -> torch.Tensor:
    """``G[rows][:, cols] − n μ_rows μ_colsᵀ`` (a block of the centred covariance; the whole matrix when
    ``rows`` is None) as one fresh copy: the rank-one correction is applied in place (``addr_``), so no
    outer product of the block's size is materialised beside it."""
    if rows is None:
        return g.clone().addr_(mu, mu, alpha=-n)
    return _block(g, rows, cols).addr_(mu[rows], mu[cols], alpha=-n)


def _bias_plus(bias: torch.Tensor | None, delta: torch.Tensor) -> torch.Tensor:
    return delta if bias is None else bias.to(SOLVE_PRECISION) + delta


@register("none")
def _none(weight, bias, keep, stats, damp=0.0, group_size=1, release=False):
    return weight.to(SOLVE_PRECISION)[:, keep], None if bias is None else bias.to(SOLVE_PRECISION)


@register("bias")
def _bias(weight, bias, keep, stats, damp=0.0, group_size=1, release=False):
    w, _, mu, u, m = _split(weight, keep, stats)
    return w.index_select(1, u), _bias_plus(bias, w.index_select(1, m) @ mu[m])


@register("liar")
def _liar(weight, bias, keep, stats, damp=0.0, group_size=1, release=False):
    _, g, mu, u, m = _split(weight, keep, stats, weight_too=False)
    n = stats.count
    rhs = centred_block(g, mu, n, u, m)
    g_uu, factored = gram_block(partial(_block, g, u, u), stats, release)
    del g  # with release, G goes once the kept block is factorised
    q = solve_spd_in_place(g_uu, rhs, damp, factored)  # (C_u, C_m)
    del g_uu, rhs
    w_u, w_m = _columns(weight, u), _columns(weight, m)  # paper layout (C, C_out)
    pw_u = project_rows(w_m, w_u)  # P W_u, (C_m, C_out)
    new_w = w_u.addmm_(q, pw_u)  # W_u + Q P W_u, in W_u's memory
    return new_w.T, _bias_plus(bias, w_m.T @ mu[m])


@register("ls")
def _ls(weight, bias, keep, stats, damp=0.0, group_size=1, release=False):
    _, g, mu, u, m = _split(weight, keep, stats, weight_too=False)
    n = stats.count
    cov_um = centred_block(g, mu, n, u, m)
    cov_uu, factored = gram_block(partial(centred_block, g, mu, n, u, u), stats, release)
    del g  # with release, G goes once the kept block is factorised
    qc = solve_spd_in_place(cov_uu, cov_um, damp, factored)  # (C_u, C_m)
    del cov_uu, cov_um
    w_m = _columns(weight, m)  # (C_m, C_out)
    new_w = _columns(weight, u).addmm_(qc, w_m)  # W_u + Q_c W_m, in W_u's memory
    return new_w.T, _bias_plus(bias, (mu[m] - mu[u] @ qc) @ w_m)


@register("mask_tuning")
def _mask_tuning(weight, bias, keep, stats, damp=0.0, group_size=1, release=False):
    """Scales per kept group of ``group_size`` consecutive channels (a head, or a single neuron)."""
    w, g, _, u, _ = _split(weight, keep, stats)
    c_in = w.shape[1]
    if c_in % group_size:
        raise ValueError(f"{c_in} input channels do not split into groups of {group_size}")
    kept_idx = u
    group_of = kept_idx // group_size
    groups, inverse = torch.unique(group_of, return_inverse=True)
    onehot = torch.zeros(len(kept_idx), len(groups), dtype=w.dtype, device=w.device)
    onehot[torch.arange(len(kept_idx)), inverse] = 1.0
    e_u = (w.index_select(1, u).T @ w) * g.index_select(0, u)  # (C_u, C_in): (WᵀW ∘ G) rows of kept channels
    a = onehot.T @ e_u.index_select(1, u) @ onehot  # (n_groups, n_groups)
    b = onehot.T @ e_u.sum(1)  # (n_groups,)
    ones = torch.ones(len(groups), dtype=w.dtype, device=w.device)
    delta = solve_spd(a, (b - a @ ones)[:, None], damp).squeeze(1)
    alpha = (ones + delta).clamp(*MASK_TUNING_RANGE)
    new_w = w.index_select(1, u) * (onehot @ alpha)[None, :]
    return new_w, None if bias is None else bias.to(SOLVE_PRECISION)


def reconstruct_from_stats(
    method: str,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    stats: InputStats,
    damp: float = 0.0,
    group_size: int = 1,
    release: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch to a registered method. Results are float64 (SOLVE_PRECISION). ``release``: the
    statistics may be freed as soon as the method has what it needs (not read again by the caller)."""
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
    return METHODS[method](weight, bias, keep, stats, damp=damp, group_size=group_size, release=release)


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
    """‖X W + B − (X_u W' + B')‖² / ‖X W + B‖² for each candidate ``(W', B')``, over ``stats``' tokens."""
    return [float(e) for e in relative_output_error_tensors(weight, bias, keep, candidates, stats)]


def relative_output_error_tensors(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    candidates: list[tuple[torch.Tensor, torch.Tensor | None]],
    stats: InputStats,
) -> list[torch.Tensor]:
    """:func:`relative_output_errors` as 0-d tensors on the weight's device (nothing is read back, so a
    GPU run is not synchronised per layer).

    Closed form from G, s, n: ‖XΔᵀ + 1δᵀ‖² = tr(Δ G Δᵀ) + 2 δᵀ Δ s + n ‖δ‖², expanded around the
    original weight so that the one product over all C_in² entries of G, ``H = W G``, is shared: with
    ``E = [W', 0]`` (kept columns replaced, pruned ones zero) ``tr(ΔGΔᵀ) = tr(WGWᵀ) − 2 tr(H_u W'ᵀ) +
    tr(W' G_uu W'ᵀ)``, so a candidate costs a C_u² product instead of a C_in² one (in float64: the
    expansion subtracts nearly equal terms when the error is small).

    On a GPU the float64 products would dominate a layer's time (float64 runs at a fraction of the
    tensor-core rate), so there each candidate's ``tr(ΔGΔᵀ)`` is computed directly — no cancellation —
    with TF32 products: a relative accuracy of about 1e-3 on the reported error, ample for a report.
    """
    if weight.is_cuda:
        return _error_tensors_tf32(weight, bias, keep, candidates, stats)
    w = weight.to(SOLVE_PRECISION)
    g, s, n = stats.gram.to(SOLVE_PRECISION), stats.sum.to(SOLVE_PRECISION), stats.count
    b = torch.zeros(w.shape[0], dtype=SOLVE_PRECISION, device=w.device) if bias is None else bias.to(SOLVE_PRECISION)
    h = w @ g  # (C_out, C_in)
    u = keep.nonzero().squeeze(1)
    g_uu, s_u = _block(g, u, u), s[keep]
    ws = w @ s
    full = (h * w).sum()
    den = full + 2 * b @ ws + n * (b @ b)
    out = []
    for new_weight, new_bias in candidates:
        e = new_weight.to(SOLVE_PRECISION)
        b_new = (
            b
            if new_bias is None and bias is not None
            else (torch.zeros_like(b) if new_bias is None else new_bias.to(SOLVE_PRECISION))
        )
        quad = full - 2 * (h[:, keep] * e).sum() + ((e @ g_uu) * e).sum()
        delta_b = b - b_new
        num = quad + 2 * delta_b @ (ws - e @ s_u) + n * (delta_b @ delta_b)
        out.append(torch.where(den > 0, num.clamp_min(0) / den, torch.zeros_like(den)))
    return out


def _error_tensors_tf32(weight, bias, keep, candidates, stats: InputStats) -> list[torch.Tensor]:
    g, s, n = stats.gram.float(), stats.sum.float(), stats.count
    w = weight.float()
    b = torch.zeros(w.shape[0], device=w.device) if bias is None else bias.float()
    u = keep.nonzero().squeeze(1)
    with tf32(True):

        def sq_norm(d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # ‖X dᵀ + 1 cᵀ‖²
            return (
                ((d @ g) * d).sum(dtype=torch.float64)
                + 2 * c.double() @ (d @ s).double()
                + n * (c.double() @ c.double())
            )

        den = sq_norm(w, b)
        out = []
        for new_weight, new_bias in candidates:
            delta = w.clone()
            delta.index_add_(1, u, new_weight.float(), alpha=-1.0)
            b_new = b if new_bias is None else new_bias.float()
            out.append(torch.where(den > 0, sq_norm(delta, b - b_new).clamp_min(0) / den, torch.zeros_like(den)))
        return out


def relative_output_error_from_inputs(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keep: torch.Tensor,
    candidates: list[tuple[torch.Tensor, torch.Tensor | None]],
    x: torch.Tensor,
    x_ref: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """:func:`relative_output_errors` computed directly on raw inputs ``x`` (n, C_in), as 0-d float64
    tensors on ``x``'s device: for held-aside samples, n is far below C_in, so ``X W`` costs less than
    any product with G and no second Gram matrix is accumulated for them. ``x_ref``: the inputs the
    reference output ``x_ref W + B`` is computed from, when not ``x`` (the dense model's, for error
    feedback; row i is the same token as in ``x``).

    The products run in float32 unless the inputs are float64, with float64 sums of squares. Without
    ``x_ref`` each candidate's error is ``X Δᵀ + 1 δᵀ`` with ``Δ = W − [W', 0]`` formed in float64
    before the product, so nothing cancels and float32 gives the report to ~1e-6 relative however
    small the error (``tests/core/stats/test_reconstruct.py``); float64 products cost more than the layer's
    statistics on a CPU and run at a fraction of the rate on a GPU."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(dtype)
    u = keep.to(weight.device).nonzero().squeeze(1)
    w64 = weight.to(SOLVE_PRECISION)
    b64 = None if bias is None else bias.to(SOLVE_PRECISION)

    def product(inputs: torch.Tensor, mt: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:  # X m + c
        y = inputs @ mt.to(device=x.device, dtype=dtype)
        return y if c is None else y + c.to(device=x.device, dtype=dtype)

    with tf32(False):
        ref = product(x if x_ref is None else x_ref.to(dtype), w64.T, b64)
        x_u = None if x_ref is None else x.index_select(1, u.to(x.device))
        den = ref.square().sum(dtype=torch.float64)
        out = []
        for new_weight, new_bias in candidates:
            nb = b64 if new_bias is None else new_bias.to(SOLVE_PRECISION)
            if x_u is None:  # the difference of weights first: no cancellation in the products
                delta_t = w64.T.contiguous()  # (C_in, C_out): kept rows are contiguous to update
                delta_t.index_add_(0, u, new_weight.to(SOLVE_PRECISION).T, alpha=-1.0)
                db = None if nb is None else (-nb if b64 is None else b64 - nb)  # nb is None only if b64 is
                inputs, rows = x, delta_t.ne(0).any(1).nonzero().squeeze(1)
                if len(rows) < len(delta_t):  # plain pruning: the pruned channels only
                    inputs, delta_t = x.index_select(1, rows.to(x.device)), delta_t[rows]
                diff = product(inputs, delta_t, db)
            else:
                diff = ref - product(x_u, new_weight.T, nb)
            out.append(torch.where(den > 0, diff.square().sum(dtype=torch.float64) / den, torch.zeros_like(den)))
    return out


def relative_output_error(weight, bias, keep, new_weight, new_bias, stats: InputStats) -> float:
    """:func:`relative_output_errors` for one candidate."""
    return relative_output_errors(weight, bias, keep, [(new_weight, new_bias)], stats)[0]
