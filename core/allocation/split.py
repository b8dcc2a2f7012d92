"""``head_ratio: obs`` — each layer's split between heads and FFN neurons from measured error curves.

A uniform plan gives every layer a share of parameters to remove; ``auto`` spends it on heads at half
the layer's ratio everywhere. Here each layer picks its own split when it is pruned, from the
calibration statistics of its two output projections (o_proj and the FFN's down projection, whose
outputs both add to the residual stream, so their errors are in the same units — through the gains
of Gemma's sandwich norms, measured on the same pass, where the family has them): the greedy OBS path
of each (:func:`core.stats.select.obs_curve`) gives the summed squared output error after removing
``k`` heads and ``n`` neurons with the rest refitted, and the layer takes the ``k`` minimising

    E_heads(k) + E_neurons(n(k)),   n(k): the neurons that make up the rest of the share

over the head counts its share pays for (``k = 0`` included). The FFN path is measured with the
layer's attention still dense, the head path on the inputs o_proj really gets. Kept FFN widths are
multiples of ``round_to.neurons`` as in every plan; what a layer's rounding leaves over (or takes
beyond its share) is carried to the next layer, so the whole model stays within one rounding step of
the plan's total.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.allocation.plan import LayerPlan, kv_heads_of, multiples_near
from core.models.adapter import Adapter
from core.stats.select import Curve


@dataclass
class Choice:
    heads_removed: int  # query heads, or whole key/value groups when ``whole``
    neurons_removed: int
    removed: int  # parameters
    error: float  # E_heads + E_neurons


def best_split(
    heads: Curve, neurons: Curve, unit_cost: int, neuron_cost: int, n_neurons: int, multiple: int, share: float
) -> Choice:
    """The split of ``share`` parameters with the least summed error among those that remove the share
    to within one step of the FFN width multiple (the closest ones when none does). ``unit_cost``:
    parameters one head unit removes; ``multiple``: kept FFN widths are multiples of it (or the full
    width)."""
    cands = []
    for k in heads.removed:
        by_heads = k * unit_cost
        if k and by_heads > share:  # never more heads than the share pays for
            break
        kept = max(1, min(n_neurons, n_neurons - round((share - by_heads) / neuron_cost)))
        options = [c for c in multiples_near(kept, n_neurons, multiple) if n_neurons - c <= neurons.removed[-1]]
        if not options:
            options = [n_neurons - neurons.removed[-1]]  # as far as the FFN's path goes
        kept = min(options, key=lambda c: abs(by_heads + (n_neurons - c) * neuron_cost - share))
        gone = n_neurons - kept
        error = heads.error[heads.removed.index(k)] + neurons.at(gone)
        cands.append(Choice(k, gone, by_heads + gone * neuron_cost, error))
    if not cands:
        raise ValueError("no split of the layer's share fits the measured curves")
    step = max(1, multiple) * neuron_cost
    close = [c for c in cands if abs(c.removed - share) <= step] or [min(cands, key=lambda c: abs(c.removed - share))]
    return min(close, key=lambda c: (c.error, c.heads_removed))


@dataclass
class SplitState:
    """The running state of ``head_ratio: obs`` over the block loop: the layers' costs and constraints,
    and the parameters the layers done so far left to remove (``carry``)."""

    costs: list[dict[str, int]]
    multiple: int  # kept FFN widths are multiples of it
    whole: bool  # heads go as whole key/value groups
    prunable: list[bool]  # per layer: the criterion lets both its heads and its neurons go
    carry: float = 0.0  # parameters the earlier layers' rounding left to remove (negative: took too many)

    def active(self, li: int, lp: LayerPlan) -> bool:
        """Whether layer ``li`` chooses its own split (it is pruned, heads and neurons alike)."""
        return self.prunable[li] and lp.removed > 0

    def step(self, li: int, adapter: Adapter, lp: LayerPlan) -> int:
        """Neurons per round of the FFN's error curve: the width multiple, or about 32 rounds."""
        return self.multiple if self.multiple > 1 else max(1, -(-self.neuron_limit(li, adapter, lp) // 32))

    def _groups(self, adapter: Adapter) -> bool:
        """Whether head units are whole key/value groups (each query head its own group under MHA)."""
        return adapter.family.gqa and (self.whole or adapter.n_rep == 1)

    def unit_cost(self, li: int, adapter: Adapter) -> int:
        c = self.costs[li]
        return adapter.n_rep * c["head"] + c["kv"] if self._groups(adapter) else c["head"]

    def head_limit(self, li: int, adapter: Adapter, lp: LayerPlan) -> int:
        """Most head units the layer may lose: what its share pays for, one unit kept, and under free
        grouped-query attention one query head per key/value group."""
        share = lp.removed + self.carry
        if self._groups(adapter):
            most = adapter.n_kv_heads - 1
        elif adapter.family.gqa:
            most = adapter.n_heads - adapter.n_kv_heads
        else:
            most = adapter.n_heads - 1
        return max(0, min(most, int(share // self.unit_cost(li, adapter))))

    def neuron_limit(self, li: int, adapter: Adapter, lp: LayerPlan) -> int:
        """Most neurons the layer may lose: its whole share in neurons, plus one rounding step."""
        share = lp.removed + self.carry
        n = int(share // self.costs[li]["neuron"]) + self.multiple
        return max(0, min(n, adapter.n_neurons - max(1, self.multiple)))

    def apply(self, li: int, adapter: Adapter, lp: LayerPlan, heads: Curve, neurons: Curve) -> LayerPlan:
        """Layer ``li``'s split as a new plan of the layer (``lp`` is left as it is): heads from the head
        path, the neurons from the neuron path (the FFN's own selection may replace them, keeping
        their count). Carries what the split's rounding leaves over to the next layer."""
        share = lp.removed + self.carry
        c = self.costs[li]
        choice = best_split(
            heads, neurons, self.unit_cost(li, adapter), c["neuron"], adapter.n_neurons, self.multiple, share
        )
        if self._groups(adapter):
            kv_heads = heads.kept(adapter.n_kv_heads, choice.heads_removed)
            kept = [g * adapter.n_rep + r for g in kv_heads for r in range(adapter.n_rep)]
        else:
            kept = heads.kept(adapter.n_heads, choice.heads_removed)
            kv_heads = kv_heads_of(kept, adapter)
        self.carry = share - choice.removed
        kept_neurons = torch.tensor(neurons.kept(adapter.n_neurons, choice.neurons_removed), dtype=torch.long)
        return LayerPlan(kept, kv_heads, kept_neurons, choice.removed)
