"""Spreading a parameter budget over layers: which heads and neurons each layer keeps.

The budget is ``ratio`` × (parameters of the transformer blocks). Units and what removing them saves
(``core.adapters.unit_costs``): a query head (its q rows and o columns; for BERT also k and v rows),
a key/value group (k and v rows — removed when none of its query heads is kept), an FFN neuron.

- ``uniform``: every layer loses the same fraction. With ``modules=both`` each layer prunes
  ``round(ratio · n_heads)`` heads and then as many neurons as bring the layer closest to its share;
  with one module only, the count of that unit closest to the share. Rounding: within half a neuron's
  parameters per layer (``both`` / ``neurons``), within half a head's per layer (``heads``).
- ``global``: one ranking over all layers and both unit kinds by score per parameter removed (or by
  score, when the criterion standardises its scores, as FLAP's AL-AM does); units are dropped from
  the bottom, each counting the parameters it removes, until the budget is met.

Query heads are ranked individually; a key/value head goes only when its whole group has gone, so every
kept query head still reads its original key/value head (grouped-query attention stays exact).
Every layer keeps at least one head and one neuron.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.adapters import Adapter
from core.criteria import Scores


@dataclass
class LayerPlan:
    heads: list[int]  # kept query heads (original indices, sorted)
    kv_heads: list[int]  # kept key/value heads (original indices, sorted)
    neurons: torch.Tensor  # kept neuron indices (sorted)
    removed: int = 0  # parameters this plan removes from the layer


@dataclass
class Plan:
    layers: list[LayerPlan]
    block_params: int
    target_removed: int
    removed: int = field(init=False)

    def __post_init__(self) -> None:
        self.removed = sum(lp.removed for lp in self.layers)

    @property
    def ratio(self) -> float:
        return self.removed / self.block_params


def _kv_of(heads: list[int], adapter: Adapter) -> list[int]:
    if not adapter.family.gqa:
        return list(heads)
    return sorted({h // adapter.n_rep for h in heads})


def _layer_plan(
    adapter: Adapter, costs: dict[str, int], drop_heads: set[int], n_drop_neurons: int, neuron_order: torch.Tensor
) -> LayerPlan:
    heads = [h for h in range(adapter.n_heads) if h not in drop_heads]
    kv = _kv_of(heads, adapter)
    n_kv_dropped = (adapter.n_kv_heads - len(kv)) if adapter.family.gqa else 0
    neurons = neuron_order[n_drop_neurons:].sort().values
    removed = len(drop_heads) * costs["head"] + n_kv_dropped * costs["kv"] + n_drop_neurons * costs["neuron"]
    return LayerPlan(heads, kv, neurons, removed)


def max_ratio(adapter: Adapter, modules: str, costs: list[dict[str, int]], block_params: int) -> float:
    """The largest ratio reachable while every layer keeps one head and one neuron."""
    most = 0
    for c in costs:
        if modules in ("heads", "both"):
            most += (adapter.n_heads - 1) * c["head"] + (adapter.n_kv_heads - 1) * c["kv"] * adapter.family.gqa
        if modules in ("neurons", "both"):
            most += (adapter.n_neurons - 1) * c["neuron"]
    return most / block_params


def allocate(
    scores: list[Scores],
    adapter: Adapter,
    costs: list[dict[str, int]],
    layer_params: list[int],
    ratio: float,
    modules: str,
    allocation: str,
) -> Plan:
    block_params = sum(layer_params)
    reachable = max_ratio(adapter, modules, costs, block_params)
    if ratio > reachable:
        raise ValueError(
            f"ratio {ratio} cannot be reached by pruning {modules}: at most {reachable:.3f} of the "
            f"transformer blocks' parameters can go while every layer keeps one head and one neuron"
        )
    target = round(ratio * block_params)
    if allocation == "uniform":
        layers = [
            _uniform_layer(s, adapter, c, ratio, ratio * p, modules) for s, c, p in zip(scores, costs, layer_params)
        ]
    elif allocation == "global":
        layers = _global(scores, adapter, costs, target, modules)
    else:
        raise ValueError(f"unknown allocation {allocation!r}; choose uniform or global")
    return Plan(layers, block_params, target)


def _uniform_layer(
    s: Scores, adapter: Adapter, c: dict[str, int], ratio: float, share: float, modules: str
) -> LayerPlan:
    head_order = torch.argsort(s.heads, stable=True).tolist()
    neuron_order = torch.argsort(s.neurons, stable=True)
    with_heads = lambda k: _layer_plan(adapter, c, set(head_order[:k]), 0, neuron_order)  # noqa: E731
    if modules == "heads":
        return min((with_heads(k) for k in range(adapter.n_heads)), key=lambda lp: abs(lp.removed - share))
    k = min(round(ratio * adapter.n_heads), adapter.n_heads - 1) if modules == "both" else 0
    base = with_heads(k)
    n = round((share - base.removed) / c["neuron"])
    n = max(0, min(n, adapter.n_neurons - 1))
    return _layer_plan(adapter, c, set(head_order[:k]), n, neuron_order)


def _global(scores, adapter: Adapter, costs, target: int, modules: str) -> list[LayerPlan]:
    # standardised scores (FLAP's AL-AM) are ranked as they are; others by score per parameter removed
    per_param = not all(s.comparable for s in scores)
    cand = []  # (rank key, layer, kind, index)
    for li, (s, c) in enumerate(zip(scores, costs)):
        if modules in ("heads", "both"):
            div = c["head"] if per_param else 1.0
            cand += [(float(v) / div, li, 0, h) for h, v in enumerate(s.heads.tolist())]
        if modules in ("neurons", "both"):
            div = c["neuron"] if per_param else 1.0
            cand += [(float(v) / div, li, 1, k) for k, v in enumerate(s.neurons.tolist())]
    cand.sort()
    n_layers = len(scores)
    drop_heads = [set() for _ in range(n_layers)]
    drop_neurons: list[list[int]] = [[] for _ in range(n_layers)]
    group_left = [[adapter.n_rep] * adapter.n_kv_heads for _ in range(n_layers)]
    removed = 0
    for _, li, kind, idx in cand:
        if removed >= target:
            break
        c = costs[li]
        if kind == 0:
            if len(drop_heads[li]) >= adapter.n_heads - 1:
                continue
            gain = c["head"]
            if adapter.family.gqa and group_left[li][idx // adapter.n_rep] == 1:
                gain += c["kv"]
        else:
            if len(drop_neurons[li]) >= adapter.n_neurons - 1:
                continue
            gain = c["neuron"]
        if removed + gain - target > target - removed:  # overshooting more than stopping short
            continue
        removed += gain
        if kind == 0:
            drop_heads[li].add(idx)
            if adapter.family.gqa:
                group_left[li][idx // adapter.n_rep] -= 1
        else:
            drop_neurons[li].append(idx)
    plans = []
    for li in range(n_layers):
        dropped = torch.tensor(drop_neurons[li], dtype=torch.long)
        rest = torch.tensor([k for k in range(adapter.n_neurons) if k not in set(drop_neurons[li])], dtype=torch.long)
        plans.append(_layer_plan(adapter, costs[li], drop_heads[li], len(dropped), torch.cat([dropped, rest])))
    return plans
