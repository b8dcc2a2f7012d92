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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from core.stats.accumulate import InputStats
from core.stats.reconstruct import centred_block
from core.stats.spd_inverse import inverse_spd

SELECT_PRECISION = torch.float64  # as the solves
COMPACT_BELOW = 0.85  # working matrices are compacted once live channels fall under this share


def damped_inverse_covariance(stats: InputStats, damp: float, release: bool = False) -> torch.Tensor:
    """``(C + λI)⁻¹`` of the centred input covariance ``C = G − n μμᵀ``, damped, with dead channels and
    failed factorisations handled as in every other solve (:func:`~core.stats.spd_inverse.solve_spd`),
    computed in the memory of one copy of G (:func:`~core.stats.spd_inverse.inverse_spd`).

    ``release``: ``stats`` are not needed afterwards; G is centred, factorised and inverted in its own
    memory and the statistics are freed, so no second C × C float64 matrix exists at any point. Only a
    float32 copy of C is kept meanwhile, for the retries of a factorisation that fails (which
    overwrites G): their damping is raised tenfold, far above float32's rounding of C."""
    n = stats.count
    mu = stats.sum.to(SELECT_PRECISION) / n
    if not release:
        return inverse_spd(lambda: centred_block(stats.gram.to(SELECT_PRECISION), mu, n), damp)
    first = [stats.gram.addr_(mu, mu, alpha=-n)]  # float64 totals: the statistics' own matrix
    backup = first[0].to(torch.float32)
    stats.free()
    return inverse_spd(lambda: first.pop() if first else backup.to(SELECT_PRECISION), damp)


def _unit_errors(wt: torch.Tensor, hinv: torch.Tensor, first: torch.Tensor, group: int) -> torch.Tensor:
    """``E({u})`` for the units whose ``group`` channels start at rows ``first`` of ``wt`` (the weights
    transposed: one row per input channel) and of ``hinv``."""
    if group == 1:  # row norms of the transposed weights: a contiguous reduction, no C_in × C_out temporary
        return torch.linalg.vector_norm(wt, dim=1)[first].square() / hinv.diagonal()[first]
    ch = (first[:, None] + torch.arange(group, device=first.device)).reshape(-1)
    blocks = hinv[ch][:, ch].reshape(len(first), group, len(first), group)
    idx = torch.arange(len(first), device=first.device)
    h_uu = blocks[idx, :, idx, :]  # (units, group, group)
    w_u = wt[ch].reshape(len(first), group, wt.shape[1])  # (units, group, C_out)
    # H⁻¹_uu is a principal block of an SPD matrix: Cholesky. (A batched LU solve, torch.linalg.solve,
    # failed on 2 CPU threads with torch 2.13's MKL for SmolLM2's 192-channel key/value groups: "Pivots
    # given to lu_solve must all be greater or equal to 1", DLASWP parameter errors.)
    # cholesky_ex: no check of the factorisation's info, which would read the device once per round
    solved = torch.cholesky_solve(w_u, torch.linalg.cholesky_ex(h_uu).L)  # (units, group, C_out)
    return (w_u * solved).sum((1, 2))


def _gather_rows(m: torch.Tensor, rows: torch.Tensor, chunk: int = 256) -> None:
    """``m[:len(rows)] = m[rows]`` in place for increasing ``rows`` (so ``rows[i] >= i``): chunk by chunk,
    each chunk read before any row it reads can be overwritten, with a temporary of ``chunk`` rows."""
    for a in range(0, len(rows), chunk):
        part = rows[a : a + chunk]
        m[a : a + len(part)] = m[part]


class _Work:
    """The state of a greedy removal: the compensated weights, transposed (``wt``: one row per input
    channel), and the inverse ``hinv`` of the damped covariance of the channels still in. Removed
    channels are zeroed; once the live ones fall under ``COMPACT_BELOW`` of the working size both are
    compacted in place to the live channels (the storage is kept, so memory never grows), so that every
    later update costs the square of what is left rather than of what there was: a path to the last
    unit then does about a third of the updates' work."""

    def __init__(self, hinv: torch.Tensor, wt: torch.Tensor, group: int):
        self.hinv, self.wt, self.group = hinv, wt, group
        self.row = torch.arange(len(hinv), device=hinv.device)  # working row of each live input channel
        self.removed = 0  # channels zeroed since the last compaction

    def first_rows(self, units: torch.Tensor) -> torch.Tensor:
        return self.row[units * self.group]  # a unit's channels stay consecutive: compaction keeps order

    def channels(self, units: torch.Tensor) -> torch.Tensor:
        return (self.first_rows(units)[:, None] + torch.arange(self.group, device=units.device)).reshape(-1)

    def errors(self, units: torch.Tensor) -> torch.Tensor:
        return _unit_errors(self.wt, self.hinv, self.first_rows(units), self.group)

    def remove(self, units: torch.Tensor, error: bool = False) -> torch.Tensor | None:
        """Remove ``units``: compensate the weights and update the inverse in place. With ``error``,
        returns the rise of the summed squared output error, ``tr(W_S (H⁻¹_SS)⁻¹ W_Sᵀ)`` (0-d, on
        the device)."""
        wt, hinv, s = self.wt, self.hinv, self.channels(units)
        rows = hinv[s]  # (|S|, live)
        h_ss = rows[:, s]
        w_s = wt[s]  # (|S|, C_out)
        rhs = torch.cat([rows, w_s], 1) if error else rows
        # solve_ex: H⁻¹_SS is a principal block of an SPD matrix, and solve's singularity check would
        # read the device once per round; a breakdown shows as non-finite values, checked at the end
        coef = torch.linalg.solve_ex(h_ss, rhs).result  # (H⁻¹_SS)⁻¹ H⁻¹_S,:  [| (H⁻¹_SS)⁻¹ W_Sᵀ]
        rise = (w_s * coef[:, rows.shape[1] :]).sum() if error else None
        coef = coef[:, : rows.shape[1]]
        wt.addmm_(coef.T, w_s, alpha=-1)  # in place, as below: no product beside the operands
        hinv.addmm_(rows.T, coef, alpha=-1)
        wt[s] = 0.0
        hinv[s, :] = 0.0
        hinv[:, s] = 0.0
        hinv[s, s] = 1.0  # removed channels stay out of later solves
        self.removed += len(s)
        return rise

    def compact(self, units: torch.Tensor) -> None:
        """Drop the removed channels' rows and columns once they are more than ``1 - COMPACT_BELOW``
        of the working size (``units``: the live units, increasing)."""
        size = len(self.hinv)
        if size - self.removed >= COMPACT_BELOW * size:
            return
        keep = self.channels(units)
        n = len(keep)
        _gather_rows(self.wt, keep)
        _gather_rows(self.hinv, keep)
        _gather_rows(self.hinv[:n].T, keep)  # the columns likewise, within the kept rows
        self.wt, self.hinv = self.wt[:n], self.hinv[:n, :n]
        self.row[units * self.group] = torch.arange(0, n, self.group, device=keep.device)
        self.removed = 0


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
    release: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """Greedy removal of ``n_remove`` candidate units, ``per_round`` at a time (one when constrained by
    ``groups_of``). Non-candidates are removed first, silently. Yields ``(dropped, error)``
    after each round: the units just dropped and, with ``with_error``, the rise of the output error
    (0-d, on the device; else None). ``release``: free ``stats`` once the inverse is built (the
    caller's last use of them), before the working copy of the weights is made."""
    n_units = weight.shape[1] // group
    cand = list(range(n_units)) if candidates is None else sorted(candidates)
    if not 0 <= n_remove < len(cand):
        raise ValueError(f"cannot remove {n_remove} of {len(cand)} candidate units and keep one")
    hinv = damped_inverse_covariance(stats, damp, release).to(weight.device)
    dev = hinv.device
    wt = torch.empty(weight.shape[1], weight.shape[0], dtype=SELECT_PRECISION, device=dev)
    work = _Work(hinv, wt.copy_(weight.detach().T), group)
    units = torch.tensor(cand, dtype=torch.long, device=dev)  # the live units, increasing
    gone = sorted(set(range(n_units)) - set(cand))
    if gone:
        work.remove(torch.tensor(gone, dtype=torch.long, device=dev))
        work.compact(units)
    groups = None if groups_of is None else torch.tensor(groups_of, device=dev)
    if groups is not None:
        per_round = 1
        sizes = Counter(groups_of[u] for u in cand)  # each group keeps one: decided here, not per round
        if n_remove > sum(n - 1 for n in sizes.values()):
            raise ValueError(
                f"cannot remove {n_remove} units: every group is down to one after {sum(sizes.values()) - len(sizes)}"
            )
        n_groups = max(groups_of) + 1
    while n_remove > 0:  # no read of the device in a round: the path is read by the caller at the end
        errors = work.errors(units)
        if groups is not None:  # the last kept unit of a group may not go
            g = groups[units]
            left = torch.zeros(n_groups, dtype=torch.long, device=dev).index_add_(0, g, torch.ones_like(g))
            errors = torch.where(left[g] <= 1, torch.full_like(errors, math.inf), errors)
        k = min(per_round, n_remove)
        picked = torch.topk(errors, k, largest=False).indices
        drop = units[picked]
        rise = work.remove(drop, with_error)
        # the live units without the dropped ones, in order, sized on the host: no read of the device
        live = torch.ones(len(units), dtype=torch.int8, device=dev).index_fill_(0, picked, 0)
        units = units[torch.argsort(live, descending=True, stable=True)[: len(units) - k]]
        work.compact(units)
        n_remove -= k
        yield drop, rise
    if not bool(torch.isfinite(work.hinv.diagonal()).all()):  # one read for the whole path
        raise ValueError(
            "the OBS selection's inverse covariance broke down (non-finite values); raise "
            "reconstruction.damp or the number of calibration samples"
        )


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
    drops = [drop for drop, _ in _greedy(weight, stats, to_remove, group, damp, candidates, groups_of, per_round)]
    gone = set(torch.cat(drops).tolist()) if drops else set()  # one read of the device, not one per round
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
    release: bool = False,
) -> Curve:
    """The greedy OBS path of :func:`obs_select` removing up to ``n_remove`` units, ``step`` per round,
    with the output error after every round (exact for the sets removed: each round's rise is the
    joint error of its units given the compensation of the rounds before; one read of the device).
    ``release``: ``stats`` are not needed after this call; they are freed as soon as the inverse is
    built, so the path runs beside one C_in × C_in matrix rather than two."""
    drops, rises, removed = [], [], [0]
    for drop, error in _greedy(
        weight, stats, n_remove, group, damp, candidates, groups_of, step, with_error=True, release=release
    ):
        drops.append(drop)  # kept on the device: the path is read once at the end, not once per round
        rises.append(error)
        removed.append(removed[-1] + len(drop))
    order = torch.cat(drops).tolist() if drops else []
    errors = [0.0] + (torch.stack(rises).cumsum(0).tolist() if rises else [])
    return Curve(order, removed, errors)
