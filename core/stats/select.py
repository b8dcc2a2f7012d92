"""Reconstruction-aware selection: which units of a layer to drop, given that the rest is refitted.

A criterion scores units one by one, before any reconstruction. Here the choice is made on the
calibration statistics the reconstruction uses, as structured optimal brain surgeon methods do
(SlimGPT, ZipLM): removing the input channels ``S`` of a projection with weights ``W`` (C_out × C_in)
and refitting the rest by least squares (with a bias, i.e. on the centred covariance ``C``, damped
like the ``ls`` solve: ``H = C + λI``) raises the summed squared output error by

    E(S) = tr( W_S (H⁻¹_SS)⁻¹ W_Sᵀ )

and leaves the compensated weights ``W − W_S (H⁻¹_SS)⁻¹ H⁻¹_S,:`` and the inverse of what remains,
``H⁻¹ − H⁻¹_:,S (H⁻¹_SS)⁻¹ H⁻¹_S,:``. Units (a head: ``group`` consecutive channels; a neuron: one)
are removed greedily in a few rounds — each round drops the units of least ``E`` given everything
removed so far, then updates both — so later choices see the compensation of earlier ones. The
count per layer stays the allocation's; only which units go changes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from core.stats.accumulate import InputStats
from core.stats.reconstruct import centred_block, inverse_spd

SELECT_PRECISION = torch.float64  # as the solves


def damped_inverse_covariance(stats: InputStats, damp: float) -> torch.Tensor:
    """``(C + λI)⁻¹`` of the centred input covariance ``C = G − n μμᵀ``, damped, with dead channels and
    failed factorisations handled as in every other solve (:func:`~core.stats.reconstruct.solve_spd`),
    computed in the memory of one copy of G (:func:`~core.stats.reconstruct.inverse_spd`)."""
    n = stats.count
    mu = stats.sum.to(SELECT_PRECISION) / n
    return inverse_spd(lambda: centred_block(stats.gram.to(SELECT_PRECISION), mu, n), damp)


def _unit_errors(w: torch.Tensor, hinv: torch.Tensor, units: torch.Tensor, group: int) -> torch.Tensor:
    """``E({u})`` for each unit in ``units`` (indices of units of ``group`` channels)."""
    if group == 1:  # column norms by a reduction: no C_out × C_in temporary of the squares
        return torch.linalg.vector_norm(w, dim=0)[units].square() / hinv.diagonal()[units]
    ch = (units[:, None] * group + torch.arange(group, device=units.device)).reshape(-1)
    blocks = hinv[ch][:, ch].reshape(len(units), group, len(units), group)
    idx = torch.arange(len(units), device=units.device)
    h_uu = blocks[idx, :, idx, :]  # (units, group, group)
    w_u = w[:, ch].reshape(w.shape[0], len(units), group).permute(1, 0, 2)  # (units, C_out, group)
    # H⁻¹_uu is a principal block of an SPD matrix: Cholesky. (A batched LU solve, torch.linalg.solve,
    # failed on 2 CPU threads with torch 2.13's MKL for SmolLM2's 192-channel key/value groups: "Pivots
    # given to lu_solve must all be greater or equal to 1", DLASWP parameter errors.)
    solved = torch.cholesky_solve(w_u.transpose(1, 2), torch.linalg.cholesky(h_uu))  # (units, group, C_out)
    return (w_u.transpose(1, 2) * solved).sum((1, 2))


def _remove(w: torch.Tensor, hinv: torch.Tensor, channels: torch.Tensor, error: bool = False) -> torch.Tensor | None:
    """Remove ``channels``: compensate ``w`` and update ``hinv`` in place. With ``error``, returns the
    rise of the summed squared output error, ``tr(W_S (H⁻¹_SS)⁻¹ W_Sᵀ)`` (0-d, not read back)."""
    h_ss = hinv[channels][:, channels]
    rows = hinv[channels]  # (|S|, C_in)
    w_s = w[:, channels]
    rhs = torch.cat([rows, w_s.T], 1) if error else rows
    coef = torch.linalg.solve(h_ss, rhs)  # (H⁻¹_SS)⁻¹ H⁻¹_S,:  [| (H⁻¹_SS)⁻¹ W_Sᵀ]
    rise = (w_s.T * coef[:, rows.shape[1] :]).sum() if error else None
    coef = coef[:, : rows.shape[1]]
    w.addmm_(w_s, coef, alpha=-1)  # in place, as below: no C_out × C_in product beside w
    hinv.addmm_(rows.T, coef, alpha=-1)  # in place: no C_in × C_in temporary
    w[:, channels] = 0.0
    hinv[channels, :] = 0.0
    hinv[:, channels] = 0.0
    hinv[channels, channels] = 1.0  # removed channels stay out of later solves
    return rise


def _greedy(
    weight: torch.Tensor,
    stats: InputStats,
    n_remove: int,
    group: int,
    damp: float,
    candidates: list[int] | None,
    groups_of: list[int] | None,
    per_round: int,
    with_error: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """Greedy removal of ``n_remove`` candidate units, ``per_round`` at a time (one when constrained by
    ``groups_of``). Non-candidates are removed first, silently. Yields ``(dropped, error)``
    after each round: the units just dropped and, with ``with_error``, the rise of the output error
    (0-d, on the device; else None)."""
    n_units = weight.shape[1] // group
    cand = list(range(n_units)) if candidates is None else sorted(candidates)
    if not 0 <= n_remove < len(cand):
        raise ValueError(f"cannot remove {n_remove} of {len(cand)} candidate units and keep one")
    w = weight.detach().to(SELECT_PRECISION).clone()
    hinv = damped_inverse_covariance(stats, damp).to(w.device)
    dev = w.device
    alive = torch.zeros(n_units, dtype=torch.bool, device=dev)
    alive[cand] = True
    gone = (~alive).nonzero().squeeze(1)
    if len(gone):
        _remove(w, hinv, (gone[:, None] * group + torch.arange(group, device=dev)).reshape(-1))
    groups = None if groups_of is None else torch.tensor(groups_of, device=dev)
    if groups is not None:
        per_round = 1
    while n_remove > 0:
        units = alive.nonzero().squeeze(1)
        errors = _unit_errors(w, hinv, units, group)
        if groups is not None:  # the last kept unit of a group may not go
            g = groups[units]
            left = torch.zeros(int(groups.max()) + 1, dtype=torch.long, device=dev).index_add_(0, g, torch.ones_like(g))
            errors = torch.where(left[g] <= 1, torch.full_like(errors, math.inf), errors)
            if not torch.isfinite(errors).any():
                raise ValueError(f"cannot remove {n_remove} more units: every group is down to one")
        k = min(per_round, n_remove)
        drop = units[torch.topk(errors, k, largest=False).indices]
        rise = _remove(w, hinv, (drop[:, None] * group + torch.arange(group, device=dev)).reshape(-1), with_error)
        alive[drop] = False
        n_remove -= k
        yield drop, rise


def obs_select(
    weight: torch.Tensor,
    stats: InputStats,
    n_keep: int,
    group: int = 1,
    damp: float = 1e-3,
    candidates: list[int] | None = None,
    groups_of: list[int] | None = None,
    rounds: int = 16,
) -> list[int]:
    """The ``n_keep`` units to keep (sorted unit indices) of a projection with ``weight`` (C_out ×
    C_in) whose inputs have statistics ``stats``.

    ``candidates``: the units that may be kept (others are removed first; default all).
    ``groups_of[u]``: a constraint group per unit (key/value group of a query head), each of which
    keeps at least one of its candidate units."""
    n_units = weight.shape[1] // group
    n_cand = n_units if candidates is None else len(candidates)
    if not 0 < n_keep <= n_cand:
        raise ValueError(f"cannot keep {n_keep} of {n_cand} candidate units")
    to_remove = n_cand - n_keep
    per_round = max(1, math.ceil(to_remove / rounds)) if group == 1 else 1
    gone: set[int] = set()
    for drop, _ in _greedy(weight, stats, to_remove, group, damp, candidates, groups_of, per_round):
        gone.update(drop.tolist())
    return [u for u in (range(n_units) if candidates is None else sorted(candidates)) if u not in gone]


@dataclass
class Curve:
    """A greedy removal path: ``order`` (units in the order they go), ``removed[j]`` units gone after
    round j and ``error[j]`` the summed squared output error then (``removed[0] = 0``, ``error[0] = 0``)."""

    order: list[int]
    removed: list[int]
    error: list[float]

    def at(self, n: int) -> float:
        """The error with ``n`` units removed, linear between the rounds' points."""
        if not 0 <= n <= self.removed[-1]:
            raise ValueError(f"the curve covers 0 to {self.removed[-1]} removed units, not {n}")
        j = bisect.bisect_left(self.removed, n)
        if self.removed[j] == n:
            return self.error[j]
        lo, hi = self.removed[j - 1], self.removed[j]
        t = (n - lo) / (hi - lo)
        return self.error[j - 1] + t * (self.error[j] - self.error[j - 1])

    def kept(self, n_units: int, n_removed: int) -> list[int]:
        """The kept units (sorted) once the first ``n_removed`` units of the path are gone."""
        if not 0 <= n_removed <= len(self.order):
            raise ValueError(f"the path removes at most {len(self.order)} units, not {n_removed}")
        gone = set(self.order[:n_removed])
        return [u for u in range(n_units) if u not in gone]


def obs_curve(
    weight: torch.Tensor,
    stats: InputStats,
    n_remove: int,
    group: int = 1,
    damp: float = 1e-3,
    candidates: list[int] | None = None,
    groups_of: list[int] | None = None,
    step: int = 1,
) -> Curve:
    """The greedy OBS path of :func:`obs_select` removing up to ``n_remove`` units, ``step`` per round,
    with the output error after every round (exact for the sets removed: each round's rise is the
    joint error of its units given the compensation of the rounds before; one read of the device)."""
    order, rises, removed = [], [], [0]
    for drop, error in _greedy(weight, stats, n_remove, group, damp, candidates, groups_of, step, with_error=True):
        order += drop.tolist()
        rises.append(error)
        removed.append(len(order))
    errors = [0.0] + (torch.stack(rises).cumsum(0).tolist() if rises else [])
    return Curve(order, removed, errors)
