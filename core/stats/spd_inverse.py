"""The inverse of a symmetric positive definite matrix from its Cholesky factor, in the factor's memory.

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

import torch

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
