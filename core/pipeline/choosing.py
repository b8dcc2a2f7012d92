"""Which units a block keeps, chosen when it is pruned: strategies that take the layer's plan and
return a new one, never changing the plan they are given.

- :class:`ByCriterion`: the plan's own units (the criterion's scores; the paper's selection);
- :class:`ByObs`: as many units as planned, chosen on the statistics the reconstruction uses
  (``reconstruction.select: obs``, :func:`core.stats.select.obs_select`);
- :class:`ObsSplit`: ``head_ratio: obs``, the layer's own split of heads and neurons from the error
  curves of its two output projections (:mod:`core.allocation.split`), then :class:`ByObs`'s neurons.

Each strategy has ``heads(lp, weight, stats)`` for the attention's output projection and
``neurons(lp, weight, stats)`` for the FFN's, given that projection's weight and input statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.allocation.plan import LayerPlan, kv_heads_of
from core.allocation.split import SplitState
from core.models.adapter import Adapter
from core.stats.accumulate import InputStats, OutputGain, in_residual_units
from core.stats.select import Curve, obs_curve, obs_select


@dataclass(frozen=True)
class ByCriterion:
    """The planned units, as the criterion ranked them."""

    reads_stats = False  # the choice is made before the statistics: only the kept inputs are kept
    splits = False  # the plan's head count stands

    def heads(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        return lp

    def neurons(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        return lp


@dataclass(frozen=True)
class ByObs:
    """Reconstruction-aware choice of as many units as planned (the parameter count is the plan's).
    ``whole``: heads go as whole key/value groups (``round_to.kv_groups: whole``)."""

    adapter: Adapter
    damp: float
    whole: bool = False
    reads_stats = True
    splits = False

    def heads(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        """The kept query heads among those of the planned key/value groups, each group keeping one at
        least; under ``whole``, as many whole groups as planned, any of them (each costs the same)."""
        a = self.adapter
        n_rep = a.n_rep if a.family.gqa else 1
        if self.whole and n_rep > 1:  # a group's query heads are n_rep consecutive blocks of o_proj's inputs
            kv = obs_select(weight, stats, len(lp.kv_heads), n_rep * a.head_dim, self.damp)
            return replace(lp, heads=[g * n_rep + r for g in kv for r in range(n_rep)], kv_heads=kv)
        kept_groups = set(lp.kv_heads)
        candidates = [h for h in range(a.n_heads) if h // n_rep in kept_groups] if n_rep > 1 else None
        groups = [h // n_rep for h in range(a.n_heads)] if n_rep > 1 else None
        heads = obs_select(weight, stats, len(lp.heads), a.head_dim, self.damp, candidates, groups)
        # with a key/value head per query head, they move together
        return replace(lp, heads=heads, kv_heads=kv_heads_of(heads, a))

    def neurons(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        kept = obs_select(weight, stats, len(lp.neurons), 1, self.damp)
        return replace(lp, neurons=torch.tensor(kept, dtype=torch.long))


@dataclass(frozen=True)
class ObsSplit:
    """``head_ratio: obs`` for layer ``layer``: its split from the error curves of o_proj (measured by
    :meth:`heads`, through its output norm's ``gain`` where there is one) and of its FFN (``ffn``,
    measured on the dense block beforehand); ``split`` carries what the earlier layers' rounding left."""

    obs: ByObs
    split: SplitState
    layer: int
    ffn: Curve
    gain: OutputGain | None = None
    reads_stats = True
    splits = True  # the attention is measured even when the plan keeps every head

    def heads(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        a, damp, split = self.obs.adapter, self.obs.damp, self.split
        n_rep = a.n_rep if a.family.gqa else 1
        weight = in_residual_units(weight, self.gain)
        limit = split.head_limit(self.layer, a, lp)
        if split.whole or n_rep == 1:  # units of n_rep heads (one head without GQA)
            heads = obs_curve(weight, stats, limit, n_rep * a.head_dim, damp)
        else:
            groups = [h // n_rep for h in range(a.n_heads)]  # each group keeps a query head
            heads = obs_curve(weight, stats, limit, a.head_dim, damp, groups_of=groups)
        return split.apply(self.layer, a, lp, heads, self.ffn)

    def neurons(self, lp: LayerPlan, weight: torch.Tensor, stats: InputStats) -> LayerPlan:
        return self.obs.neurons(lp, weight, stats)


Strategy = ByCriterion | ByObs | ObsSplit
"""A block's unit choice (see the module docstring)."""
