"""Solves with symmetric positive definite matrices (the refits' Gram blocks, the OBS paths' covariances)
in as little memory as the matrix itself: damping and dead channels, Cholesky factorisations in the
matrix's own memory with retries at higher damping, triangular solves that read the factor where it
is, and the inverse from a Cholesky factor in the factor's memory.

``torch.cholesky_inverse`` on a CPU is LAPACK's potri: the triangle inverted and multiplied by its
transpose in place, 2n³/3 flops. On a GPU both of torch's backends clone the factor and solve against
an identity instead (potrs): a second n × n matrix at the peak — 1 GB of float64 for LLaMA-7B's
11,008 FFN channels, 6.6 GB for a 70B model's 28,672 — and 2n³ flops of triangular solves.
:func:`cholesky_inverse_` does potri's work with recursive blocks of torch operations:

    L = [[A, 0], [B, C]]   L⁻¹ = [[A⁻¹, 0], [−C⁻¹ B A⁻¹, C⁻¹]]          (trtri)
    T = L⁻¹ = [[P, 0], [Q, R]]   Tᵀ T = [[PᵀP + QᵀQ, QᵀR], [RᵀQ, RᵀR]]   (lauum)

Each level writes its products straight into the matrix (the inverse's upper triangle is free storage
while the factor is lower triangular), so the only temporaries are the product ``B A⁻¹`` (a quarter
of the matrix at the top level) and base blocks. The off-diagonal work is matrix products, which a
GPU runs on its float64 tensor cores, and triangular solves: n³/2 + 2n³/3 flops, against potrs's 2n³.
The result is exactly symmetric (the upper triangle mirrored at the end), as LAPACK's is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

SOLVE_PRECISION = torch.float64
BASE = 512  # blocks at most this wide are inverted / multiplied directly


def _invert_lower_(t: torch.Tensor, base: int) -> None:
    """``t ← t⁻¹`` for lower-triangular ``t`` whose strict upper triangle is zero (and stays zero)."""
    n = t.shape[0]
    if n <= base:
        eye = torch.eye(n, dtype=t.dtype, device=t.device)
        t.copy_(torch.linalg.solve_triangular(t, eye, upper=False))
        return
    h = n // 2
    a, b, c = t[:h, :h], t[h:, :h], t[h:, h:]
    _invert_lower_(a, base)
    # B ← −C⁻¹ (B A⁻¹): the product, then a triangular solve with C before C itself is inverted
    torch.linalg.solve_triangular(c, b @ a, upper=False, out=b)
    b.neg_()
    _invert_lower_(c, base)


def _gram_of_lower_(t: torch.Tensor, base: int) -> None:
    """``t ← tᵀ t`` (the upper triangle included) for lower-triangular ``t`` whose strict upper
    triangle is zero; the lower triangle off the diagonal blocks is left for :func:`_mirror_upper_`."""
    n = t.shape[0]
    if n <= base:
        t.copy_(t.T @ t)
        return
    h = n // 2
    p, q, r = t[:h, :h], t[h:, :h], t[h:, h:]
    torch.mm(q.T, r, out=t[:h, h:])  # QᵀR into the free upper block, while R is still the factor's
    _gram_of_lower_(p, base)
    p.addmm_(q.T, q)  # PᵀP + QᵀQ
    _gram_of_lower_(r, base)


def _mirror_upper_(t: torch.Tensor, block: int) -> None:
    """Copy the upper triangle onto the lower one, block by block (temporaries of one block)."""
    n = t.shape[0]
    for i in range(0, n, block):
        rows = slice(i, min(i + block, n))
        d = t[rows, rows]
        d.copy_(torch.triu(d) + torch.triu(d, 1).T)
        if i + block < n:
            t[i + block :, rows] = t[rows, i + block :].T


def cholesky_inverse_(factor: torch.Tensor, base: int = BASE) -> torch.Tensor:
    """``(L Lᵀ)⁻¹`` in the memory of the lower-triangular Cholesky factor ``L`` (its strict upper
    triangle zero, as ``torch.linalg.cholesky`` leaves it); returns ``factor``. Any strides."""
    if factor.ndim != 2 or factor.shape[0] != factor.shape[1]:
        raise ValueError(f"cholesky_inverse_ needs a square matrix, got shape {tuple(factor.shape)}")
    _invert_lower_(factor, base)
    _gram_of_lower_(factor, base)
    _mirror_upper_(factor, base)
    return factor


def _condition(m: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: dead channels (zero diagonal) get a unit row, column and diagonal, and ``λ = damp ·
    mean(diag)`` is added to the diagonal (no identity matrix is built). Returns ``(scale, λ)``."""
    diag = m.diagonal()
    dead = diag <= 0
    diag[dead] = 1.0
    if dead.any():
        m[dead, :] = 0.0
        m[:, dead] = 0.0
        m.diagonal()[dead] = 1.0
    scale = diag.mean().clamp_min(torch.finfo(SOLVE_PRECISION).tiny)
    lam = damp * scale
    diag += lam
    return scale, lam


def solve_spd(
    matrix: torch.Tensor, rhs: torch.Tensor | None, damp: float = 0.0, overwrite: bool = False
) -> torch.Tensor:
    """Solve ``(M + λI) X = R`` for symmetric positive (semi-)definite M by Cholesky; with ``rhs``
    None, return ``(M + λI)⁻¹`` itself (no identity right-hand side is built).

    ``λ = damp · mean(diag M)``. Zero diagonal entries (dead channels) are set to 1. If the
    factorisation fails, the damping is raised tenfold (starting at 1e-10 relative) with a warning,
    and as a last resort the minimum-norm solution is taken from an eigendecomposition.
    ``overwrite``: ``matrix`` is a temporary of the caller's and may be modified (saves a C² copy).
    """
    m = matrix.to(SOLVE_PRECISION)
    if m is matrix and not overwrite:  # .to() copied already when the dtype differs
        m = m.clone()
    r = None if rhs is None else rhs.to(SOLVE_PRECISION)
    scale, lam = _condition(m, damp)
    diag = m.diagonal()
    for _ in range(8):
        chol, info = torch.linalg.cholesky_ex(m)
        if int(info) == 0:
            if overwrite:  # the caller's temporary is not needed any more: one C² less at the peak
                del matrix, m, diag
            return invert_factor_(chol) if r is None else solve_factored(chol, r)
        del chol
        new_lam = max(float(lam) * 10.0, 1e-10 * float(scale))
        warnings.warn(
            f"Cholesky failed (matrix {len(m)}×{len(m)} not positive definite at damping "
            f"{float(lam / scale):.1e}); retrying with damping {new_lam / float(scale):.1e}",
            RuntimeWarning,
            stacklevel=2,
        )
        diag += new_lam - lam
        lam = torch.as_tensor(new_lam, dtype=m.dtype, device=m.device)
    diag -= lam
    evals, evecs = torch.linalg.eigh(m)
    keep = evals > evals.max() * len(m) * torch.finfo(m.dtype).eps
    inv = torch.where(keep, 1.0 / evals.clamp_min(torch.finfo(m.dtype).tiny), torch.zeros_like(evals))
    return evecs @ (inv[:, None] * (evecs.T if r is None else evecs.T @ r))


# devices where torch.cholesky_inverse works in place (LAPACK's potri); elsewhere it clones the factor
IN_PLACE_POTRI = frozenset({"cpu"})


def invert_factor_(chol: torch.Tensor) -> torch.Tensor:
    """``(L Lᵀ)⁻¹`` in the memory of the lower Cholesky factor ``chol``: torch's own on a CPU (LAPACK's
    potri), :func:`~core.stats.spd_inverse.cholesky_inverse_` elsewhere (torch's clones the factor on
    a GPU and solves against an identity: one more C × C, and 2C³ flops against 7C³/6)."""
    if chol.device.type in IN_PLACE_POTRI:
        return torch.cholesky_inverse(chol, out=chol)
    return cholesky_inverse_(chol)


def solve_factored(chol: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``(L Lᵀ)⁻¹ R`` from the lower Cholesky factor ``chol``, by two triangular solves that read the
    factor where it is (``torch.cholesky_solve`` copies it first, on a CPU and on a GPU alike: one
    more C × C, 0.6 GB of float64 for the kept channels of LLaMA-7B's FFN)."""
    y = torch.linalg.solve_triangular(chol, rhs, upper=False)
    return torch.linalg.solve_triangular(chol.T, y, upper=True)


def solve_spd_in_place(
    build: Callable[[], torch.Tensor],
    rhs: torch.Tensor | None,
    damp: float = 0.0,
    factored: Callable[[], None] | None = None,
) -> torch.Tensor:
    """``(M + λI)⁻¹ R`` — or ``(M + λI)⁻¹`` itself with ``rhs`` None — for the symmetric matrix
    ``build()`` returns (a fresh float64 temporary), damped and with dead channels treated as
    :func:`solve_spd` does, but factorised in the temporary's own memory: the factorisation works in
    place on its column-major view (the same matrix, being symmetric), and the inverse
    (:func:`invert_factor_`) or the triangular solves (:func:`solve_factored`) read the factor there.
    The peak is one C × C where a factor beside the matrix (and the solve's copy of it) make it three.
    A factorisation that fails has overwritten the temporary: :func:`solve_spd`'s retries at higher
    damping then run on a second ``build()``. ``factored`` is called once ``build`` is no longer
    needed (what it reads may go: :func:`gram_block`)."""
    m = build()
    if m.dtype != SOLVE_PRECISION:
        raise TypeError(f"solve_spd_in_place needs a {SOLVE_PRECISION} matrix, got {m.dtype}")
    done = factored or (lambda: None)
    _condition(m, damp)
    view = m.T
    info = torch.empty((), dtype=torch.int32, device=m.device)
    torch.linalg.cholesky_ex(view, out=(view, info))
    if int(info) == 0:
        done()
        if rhs is None:
            invert_factor_(view)
            return m
        return solve_factored(view, rhs.to(SOLVE_PRECISION))
    del m, view
    m = build()
    done()
    return solve_spd(m, rhs, damp, overwrite=True)


def inverse_spd(build: Callable[[], torch.Tensor], damp: float = 0.0) -> torch.Tensor:
    """``(M + λI)⁻¹`` of the symmetric matrix ``build()`` returns, in that temporary's own memory
    (:func:`solve_spd_in_place`)."""
    return solve_spd_in_place(build, None, damp)
