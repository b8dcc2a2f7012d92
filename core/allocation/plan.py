"""Spreading a parameter budget over layers: which heads and neurons each layer keeps.

The budget is ``ratio`` × (parameters of the transformer blocks). Units and what removing them saves
(``core.models.adapter.unit_costs``): a query head (its q rows and o columns; for BERT also k and v rows),
a key/value group (k and v rows — removed when none of its query heads is kept), an FFN neuron.

- ``uniform``: every layer loses the same fraction. With ``modules=both`` each layer prunes
  ``round(h · n_heads)`` heads and then as many neurons as bring the layer closest to its share, where
  ``h`` (``head_ratio``) is the layer's ratio (``same``, the paper's split), half of it (``auto``: heads
  are coarse units that the least-squares refit recovers far worse than neurons —
  ``docs/results/head_ratio.md``) or a given fraction (never more heads than the layer's share pays
  for); with one module only, the count of that unit closest to the share. Rounding: within half a neuron's
  parameters per layer (``both`` / ``neurons``), within half a head's per layer (``heads``).
- ``global``: one ranking over all layers and both unit kinds by score per parameter removed (or by
  score, when the criterion standardises its scores, as FLAP's AL-AM does); units are dropped from
  the bottom, each counting the parameters it removes, until the budget is met.

- ``global`` with Kwon et al.'s Fisher scores: their mask search — heads and neurons are each ranked
  by importance over the whole network and, for every possible number of kept heads, the most
  important neurons fill the remaining parameter budget; the split keeping the largest total
  importance wins. Then, with per-sample gradients, each layer's kept set (same counts) is re-chosen
  by their greedy mask rearrangement, which minimises the layer's block-diagonal Fisher form
  ‖Σ_{k pruned} g_k‖² over samples instead of the diagonal sum.

Query heads are ranked individually; a key/value head goes only when its whole group has gone, so every
kept query head still reads its original key/value head (grouped-query attention stays exact).
Every layer keeps at least one head and one neuron. Layers whose scores say ``prunable_* = False``
keep all their heads / neurons, and the others share the budget.

Rounding (``round_to``): kept heads / neurons per layer become multiples of the given numbers (or the
full width); each layer takes the multiple below or above, chosen greedily so the total removed stays
as close to the budget as the multiples allow. :attr:`Plan.deviation` is what is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.criteria.base import Scores
from core.models.adapter import Adapter


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

    @property
    def deviation(self) -> float:
        """Achieved minus target ratio (fraction of the block parameters)."""
        return (self.removed - self.target_removed) / self.block_params


def kv_heads_of(heads: list[int], adapter: Adapter) -> list[int]:
    """The key/value heads the kept query ``heads`` read (sorted; the heads themselves without GQA)."""
    if not adapter.family.gqa:
        return list(heads)
    return sorted({h // adapter.n_rep for h in heads})


def _layer_plan(
    adapter: Adapter, costs: dict[str, int], drop_heads: set[int], n_drop_neurons: int, neuron_order: torch.Tensor
) -> LayerPlan:
    heads = [h for h in range(adapter.n_heads) if h not in drop_heads]
    kv = kv_heads_of(heads, adapter)
    n_kv_dropped = (adapter.n_kv_heads - len(kv)) if adapter.family.gqa else 0
    neurons = neuron_order[n_drop_neurons:].sort().values
    removed = len(drop_heads) * costs["head"] + n_kv_dropped * costs["kv"] + n_drop_neurons * costs["neuron"]
    return LayerPlan(heads, kv, neurons, removed)


def prunable(s: Scores, modules: str) -> tuple[bool, bool]:
    return modules in ("heads", "both") and s.prunable_heads, modules in ("neurons", "both") and s.prunable_neurons


def max_ratio(
    adapter: Adapter, modules: str, costs: list[dict[str, int]], block_params: int, scores: list[Scores] | None = None
) -> float:
    """The largest ratio reachable while every layer keeps one head and one neuron."""
    most = 0
    for i, c in enumerate(costs):
        ph, pn = prunable(scores[i], modules) if scores else (modules != "neurons", modules != "heads")
        if ph:
            most += (adapter.n_heads - 1) * c["head"] + (adapter.n_kv_heads - 1) * c["kv"] * adapter.family.gqa
        if pn:
            most += (adapter.n_neurons - 1) * c["neuron"]
    return most / block_params


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What an allocation removes and how: ``ratio`` of the block parameters from ``modules``
    (``heads`` | ``neurons`` | ``both``), spread by ``allocation`` (``uniform`` | ``global``); kept
    widths in multiples of ``round_to`` (heads, neurons); ``global_search``: the criterion's way to
    spend a global budget, ``"threshold"`` (one ranking over all units) or ``"fisher"`` (Kwon et
    al.'s mask search); ``head_ratio``: the heads' part of a uniform layer's share (``same`` |
    ``auto`` | ``obs`` | a fraction of the heads; see the module docstring); ``uniform_heads``: a
    global plan whose layers all keep the same number of query heads (:func:`_global_uniform_heads`)."""

    ratio: float
    modules: str = "both"
    allocation: str = "uniform"
    round_to: tuple[int, int] = (1, 1)
    global_search: str = "threshold"
    head_ratio: float | str = "same"
    uniform_heads: bool = False  # global: every layer keeps the same number of query heads


def allocate(
    scores: list[Scores], adapter: Adapter, costs: list[dict[str, int]], layer_params: list[int], budget: Budget
) -> Plan:
    """Keep-sets per layer removing ``budget.ratio`` of the block parameters (``costs``: each layer's
    unit costs; ``layer_params``: each layer's parameter count)."""
    ratio, modules = budget.ratio, budget.modules
    block_params = sum(layer_params)
    reachable = max_ratio(adapter, modules, costs, block_params, scores)
    if ratio > reachable:
        raise ValueError(
            f"ratio {ratio} cannot be reached by pruning {modules}: at most {reachable:.3f} of the "
            f"transformer blocks' parameters can go while every layer keeps one head and one neuron"
            + (
                " (and the criterion leaves some layers unpruned)"
                if any(not all(prunable(s, modules)) for s in scores) and modules == "both"
                else ""
            )
        )
    target = round(ratio * block_params)
    if budget.allocation == "uniform":
        active = [p for s, p in zip(scores, layer_params) if any(prunable(s, modules))]
        scale = block_params / sum(active)  # unpruned layers' share moves to the pruned ones
        heads = head_fraction(min(ratio * scale, 1.0), budget.head_ratio)
        layers = [
            _uniform_layer(s, adapter, c, heads, ratio * scale * p, modules)
            for s, c, p in zip(scores, costs, layer_params)
        ]
    elif budget.allocation == "global":
        if budget.global_search == "fisher":
            layers = _kwon_search(scores, adapter, costs, target, modules)
        elif budget.uniform_heads and modules == "both":
            layers = _global_uniform_heads(scores, adapter, costs, target, budget)
        else:
            layers = _global(scores, adapter, costs, target, modules)
    else:
        raise ValueError(f"unknown allocation {budget.allocation!r}; choose uniform or global")
    if budget.round_to != (1, 1):
        layers = _round(layers, scores, adapter, costs, target, budget)
    layers = [_rearrange(lp, s, adapter, c) for lp, s, c in zip(layers, scores, costs)]
    return Plan(layers, block_params, target)


def _orders(s: Scores) -> tuple[list[int], torch.Tensor]:
    return torch.argsort(s.heads, stable=True).tolist(), torch.argsort(s.neurons, stable=True)


def head_fraction(layer_ratio: float, head_ratio: float | str) -> float:
    """The fraction of a uniform layer's query heads (or whole key/value groups) removed: the layer's
    ratio (``same``), half of it (``auto``; also the starting plan of ``obs``, whose layers choose
    their own split when they are pruned: :mod:`core.allocation.split`) or the given fraction."""
    if head_ratio == "same":
        return layer_ratio
    if head_ratio in ("auto", "obs"):
        return layer_ratio / 2
    if isinstance(head_ratio, str) or not 0 <= head_ratio < 1:
        raise ValueError(f"head_ratio must be 'same', 'auto', 'obs' or a fraction in [0, 1), got {head_ratio!r}")
    return float(head_ratio)


def _uniform_layer(
    s: Scores, adapter: Adapter, c: dict[str, int], heads: float, share: float, modules: str
) -> LayerPlan:
    """One layer of a uniform plan removing about ``share`` parameters; ``heads``: the fraction of its
    heads removed when neurons go too (never more than the share pays for)."""
    head_order, neuron_order = _orders(s)
    ph, pn = prunable(s, modules)
    with_heads = lambda k: _layer_plan(adapter, c, set(head_order[:k]), 0, neuron_order)  # noqa: E731
    if not ph and not pn:
        return with_heads(0)
    if not pn:
        return min((with_heads(k) for k in range(adapter.n_heads)), key=lambda lp: abs(lp.removed - share))
    k = min(round(heads * adapter.n_heads), adapter.n_heads - 1) if ph else 0
    while k > 0 and with_heads(k).removed > share:  # the neurons must still be able to make up the rest
        k -= 1
    full = (adapter.n_neurons - 1) * c["neuron"]  # ... and when they cannot, more heads go
    while ph and k < adapter.n_heads - 1 and with_heads(k).removed + full < share:
        k += 1
    base = with_heads(k)
    n = round((share - base.removed) / c["neuron"])
    n = max(0, min(n, adapter.n_neurons - 1))
    return _layer_plan(adapter, c, set(head_order[:k]), n, neuron_order)


def _from_drops(adapter: Adapter, costs, drop_heads: list[set[int]], drop_neurons: list[list[int]]) -> list[LayerPlan]:
    plans = []
    for li, c in enumerate(costs):
        dropped = set(drop_neurons[li])
        order = torch.tensor(
            list(drop_neurons[li]) + [k for k in range(adapter.n_neurons) if k not in dropped], dtype=torch.long
        )
        plans.append(_layer_plan(adapter, c, drop_heads[li], len(dropped), order))
    return plans


def _over_cap(mask: torch.Tensor | None, n: int) -> list[bool]:
    return [False] * n if mask is None else mask.tolist()


def _global(scores, adapter: Adapter, costs, target: int, modules: str) -> list[LayerPlan]:
    # standardised scores (FLAP's AL-AM) are ranked as they are; others by score per parameter removed
    per_param = not all(s.comparable for s in scores)
    cand = []  # (past a soft cap, rank key, layer, kind, index)
    for li, (s, c) in enumerate(zip(scores, costs)):
        ph, pn = prunable(s, modules)
        if ph:
            div = c["head"] if per_param else 1.0
            over = _over_cap(s.over_cap_heads, len(s.heads))
            cand += [(o, float(v) / div, li, 0, h) for h, (v, o) in enumerate(zip(s.heads.tolist(), over))]
        if pn:
            div = c["neuron"] if per_param else 1.0
            over = _over_cap(s.over_cap_neurons, len(s.neurons))
            cand += [(o, float(v) / div, li, 1, k) for k, (v, o) in enumerate(zip(s.neurons.tolist(), over))]
    cand = sorted(c for c in cand if c[1] != float("inf"))  # +inf: a unit the criterion never gives up
    n_layers = len(scores)
    drop_heads = [set() for _ in range(n_layers)]
    drop_neurons: list[list[int]] = [[] for _ in range(n_layers)]
    group_left = [[adapter.n_rep] * adapter.n_kv_heads for _ in range(n_layers)]
    removed = 0
    for _, _, li, kind, idx in cand:
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
    largest = max(c["head"] + c["kv"] + c["neuron"] for c in costs)
    if target - removed > largest:
        raise ValueError(
            f"the ratio cannot be reached with the units the criterion lets go: "
            f"{removed / max(target, 1):.0%} of the budget (criterion obs: raise or remove max_layer_ratio)"
        )
    return _from_drops(adapter, costs, drop_heads, drop_neurons)


def _global_uniform_heads(scores, adapter: Adapter, costs, target: int, budget: Budget) -> list[LayerPlan]:
    """A global plan whose every layer keeps the same number of query heads (``query_heads: uniform``:
    vLLM's DeciLM form states one query-head count for all layers): each layer drops its ``k``
    lowest-scored heads, ``k`` the heads' share of a uniform plan at this ratio (``head_ratio``), and
    one global ranking of neurons spends the rest of the budget, so FFN widths (and the key/value heads
    the kept heads leave) still differ per layer. A criterion that leaves some layer's heads alone
    leaves every layer's: ``k`` is then 0."""
    orders = [_orders(s) for s in scores]
    k = round(head_fraction(budget.ratio, budget.head_ratio) * adapter.n_heads)
    k = min(k, adapter.n_heads - 1) if all(prunable(s, "both")[0] for s in scores) else 0

    def heads_only(k: int) -> list[LayerPlan]:
        return [_layer_plan(adapter, c, set(o[0][:k]), 0, o[1]) for o, c in zip(orders, costs)]

    plans = heads_only(k)
    while k > 0 and sum(lp.removed for lp in plans) > target:  # the neurons must still have a share
        k -= 1
        plans = heads_only(k)
    capacity = sum((adapter.n_neurons - 1) * c["neuron"] for s, c in zip(scores, costs) if prunable(s, "both")[1])
    while k < adapter.n_heads - 1 and k and sum(lp.removed for lp in plans) + capacity < target:
        k += 1  # ... and when they cannot make up the rest, more heads go (as in a uniform layer)
        plans = heads_only(k)
    spent = sum(lp.removed for lp in plans)
    neurons = _global(scores, adapter, costs, target - spent, "neurons")
    return [LayerPlan(h.heads, h.kv_heads, n.neurons, h.removed + n.removed) for h, n in zip(plans, neurons)]


def _kwon_search(scores: list[Scores], adapter: Adapter, costs, target: int, modules: str) -> list[LayerPlan]:
    """Kwon et al.'s mask search under a parameter budget (see the module docstring).

    Each layer's best head and best neuron are always kept (the engine keeps one of each); heads
    are added in order of importance, a head's first kept query head of a key/value group also
    paying for the group's k/v rows, and the remaining budget is filled with the best neurons.
    """
    n_layers = len(scores)
    full = sum(
        adapter.n_heads * c["head"] + adapter.n_kv_heads * c["kv"] + adapter.n_neurons * c["neuron"] for c in costs
    )
    budget = full - target  # parameters that may stay in the prunable units
    keep_heads = [set() for _ in range(n_layers)]
    keep_neurons: list[list[int]] = [[] for _ in range(n_layers)]
    base = 0
    heads, neurons = [], []  # (importance, layer, index) of the units the search may drop
    for li, (s, c) in enumerate(zip(scores, costs)):
        ph, pn = prunable(s, modules)
        h_order = torch.argsort(s.heads, descending=True, stable=True).tolist()
        n_order = torch.argsort(s.neurons, descending=True, stable=True).tolist()
        forced_h = h_order if not ph else h_order[:1]
        forced_n = n_order if not pn else n_order[:1]
        keep_heads[li].update(forced_h)
        keep_neurons[li] += forced_n
        kv = {h // adapter.n_rep for h in forced_h} if adapter.family.gqa else set()
        base += len(forced_h) * c["head"] + len(kv) * c["kv"] + len(forced_n) * c["neuron"]
        if ph:
            heads += [(float(s.heads[h]), li, h) for h in h_order[1:]]
        if pn:
            neurons += [(float(s.neurons[k]), li, k) for k in n_order[1:]]
    heads.sort(key=lambda t: -t[0])
    neurons.sort(key=lambda t: -t[0])
    n_cost = torch.tensor([costs[li]["neuron"] for _, li, _ in neurons], dtype=torch.float64).cumsum(0)
    n_imp = torch.tensor([v for v, _, _ in neurons], dtype=torch.float64).cumsum(0)
    zero = torch.zeros(1, dtype=torch.float64)
    n_cost, n_imp = torch.cat([zero, n_cost]), torch.cat([zero, n_imp])

    groups = [{h // adapter.n_rep for h in keep_heads[li]} for li in range(n_layers)]
    best, head_cost, head_imp = None, 0.0, 0.0
    for n_h in range(len(heads) + 1):
        if n_h:
            _, li, h = heads[n_h - 1]
            head_cost += costs[li]["head"]
            head_imp += heads[n_h - 1][0]
            g = h // adapter.n_rep
            if adapter.family.gqa and g not in groups[li]:
                groups[li].add(g)
                head_cost += costs[li]["kv"]
        room = budget - base - head_cost
        if room < 0:
            break
        n_n = int(torch.searchsorted(n_cost, torch.tensor([room], dtype=torch.float64), right=True)) - 1
        total = head_imp + float(n_imp[n_n])
        if best is None or total > best[0]:
            best = (total, n_h, n_n)
    _, n_h, n_n = best if best is not None else (0.0, 0, 0)
    for _, li, h in heads[:n_h]:
        keep_heads[li].add(h)
    for _, li, k in neurons[:n_n]:
        keep_neurons[li].append(k)
    drop_heads = [set(range(adapter.n_heads)) - keep_heads[li] for li in range(n_layers)]
    drop_neurons = [sorted(set(range(adapter.n_neurons)) - set(keep_neurons[li])) for li in range(n_layers)]
    return _from_drops(adapter, costs, drop_heads, drop_neurons)


def greedy_rearrange(keep: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Kwon et al.'s mask rearrangement for one layer: same number kept, pruned set P chosen to
    minimise ‖Σ_{k∈P} g_k‖² (``grads``: samples × units), greedily — start from the units with the
    smallest Σ_i g_ik², then offer every other unit in ascending order, each time dropping from P the
    unit whose removal leaves the smallest norm. Returns a boolean keep mask."""
    n_pruned = int((~keep).sum())
    if n_pruned == 0 or n_pruned == len(keep):
        return keep.clone()
    g = grads.T.to(torch.float64)  # units × samples
    sq = g.pow(2).sum(1)  # ‖g_j‖²
    order = torch.argsort(sq, stable=True).tolist()
    # with s = Σ_{k∈P} g_k, ‖s − g_j‖² = ‖s‖² − 2 g_j·s + ‖g_j‖²: each offer needs only the dot products
    # d_j = g_j·s, kept up to date from the units' Gram matrix (one C × C product instead of a
    # |P| × samples gather and reduction per offer: 3.6 s → 0.1 s for MiniLM's 6 × 1536 neurons)
    gram = g @ g.T
    pruned = order[:n_pruned]
    dots = gram[:, pruned].sum(1)
    for unit in order[n_pruned:]:
        pruned.append(unit)
        dots += gram[:, unit]
        members = torch.tensor(pruned)
        gone = pruned.pop(int((sq[members] - 2 * dots[members]).argmin()))  # ‖s‖² is the same for all
        dots -= gram[:, gone]
    out = torch.ones_like(keep)
    out[pruned] = False
    return out


def _rearrange(lp: LayerPlan, s: Scores, adapter: Adapter, c: dict[str, int]) -> LayerPlan:
    heads, kv, neurons = lp.heads, lp.kv_heads, lp.neurons
    if s.head_samples is not None and len(heads) < adapter.n_heads:
        keep = torch.zeros(adapter.n_heads, dtype=torch.bool)
        keep[heads] = True
        new = greedy_rearrange(keep, s.head_samples).nonzero().squeeze(1).tolist()
        if len(kv_heads_of(new, adapter)) == len(kv):  # same parameter count (GQA groups unchanged)
            heads, kv = new, kv_heads_of(new, adapter)
    if s.neuron_samples is not None and len(neurons) < adapter.n_neurons:
        keep = torch.zeros(adapter.n_neurons, dtype=torch.bool)
        keep[neurons] = True
        neurons = greedy_rearrange(keep, s.neuron_samples).nonzero().squeeze(1)
    return LayerPlan(heads, kv, neurons, lp.removed)


def auto_multiple(n_neurons: int, device_type: str) -> int:
    """The FFN width multiple ``round_to.neurons: auto`` means: 128 on a GPU (tensor-core tiles),
    64 on a CPU (measured fastest in ``docs/results/latency.md``), halved until the FFN has at least 16
    steps of it; 1 (exact widths) when even 8 is too coarse."""
    m = 128 if device_type == "cuda" else 64
    while m >= 8 and n_neurons < 16 * m:
        m //= 2
    return m if m >= 8 else 1


def multiples_near(kept: int, total: int, m: int) -> list[int]:
    """Kept counts that are multiples of ``m`` (or the full width) next to ``kept``; at least ``m``."""
    if m == 1:
        return [kept]
    lo = max(m, kept // m * m)
    hi = min(total, -(-kept // m) * m)
    return sorted({min(lo, total), hi})


def _rebalanced(adapter: Adapter, c: dict[str, int], drop: set[int], removed: int) -> int:
    """Kept neurons that bring a layer dropping the heads ``drop`` closest to ``removed`` parameters."""
    by_heads = _layer_plan(adapter, c, drop, 0, torch.arange(adapter.n_neurons)).removed
    n = round((removed - by_heads) / c["neuron"])
    return adapter.n_neurons - max(0, min(n, adapter.n_neurons - 1))


def _round(layers, scores, adapter: Adapter, costs, target: int, budget: Budget) -> list[LayerPlan]:
    (m_heads, m_neurons), modules = budget.round_to, budget.modules
    options = []  # per layer: candidate LayerPlans
    for lp, s, c in zip(layers, scores, costs):
        head_order, neuron_order = _orders(s)
        ph, pn = prunable(s, modules)
        h_counts = multiples_near(len(lp.heads), adapter.n_heads, m_heads) if ph else [len(lp.heads)]
        own_counts = multiples_near(len(lp.neurons), adapter.n_neurons, m_neurons) if pn else [len(lp.neurons)]
        cands = []
        for hk in h_counts:
            # keep the layer's own choice of heads when the count is unchanged, else re-rank by score
            drop = (
                set(range(adapter.n_heads)) - set(lp.heads)
                if hk == len(lp.heads)
                else set(head_order[: adapter.n_heads - hk])
            )
            n_counts = own_counts
            if pn and hk != len(lp.heads):  # the neurons make up what the other head count moves
                n_counts = multiples_near(_rebalanced(adapter, c, drop, lp.removed), adapter.n_neurons, m_neurons)
            for nk in n_counts:
                if nk == len(lp.neurons):
                    kept = set(lp.neurons.tolist())
                    order = torch.tensor(
                        [k for k in range(adapter.n_neurons) if k not in kept] + sorted(kept), dtype=torch.long
                    )
                else:
                    order = neuron_order
                cands.append(_layer_plan(adapter, c, drop, adapter.n_neurons - nk, order))
        options.append(cands)
    # start at the candidate closest to each layer's own plan, then flip single layers while it helps
    choice = [
        min(range(len(o)), key=lambda i, o=o, lp=lp: abs(o[i].removed - lp.removed)) for o, lp in zip(options, layers)
    ]
    total = sum(o[i].removed for o, i in zip(options, choice))
    while True:
        best = None
        for li, o in enumerate(options):
            for i, cand in enumerate(o):
                new_total = total - o[choice[li]].removed + cand.removed
                if abs(new_total - target) < abs(total - target) and (
                    best is None or abs(new_total - target) < best[0]
                ):
                    best = (abs(new_total - target), li, i, new_total)
        if best is None:
            break
        _, li, i, total = best
        choice[li] = i
    return [o[i] for o, i in zip(options, choice)]
