"""Whole key/value groups (``round_to.kv_groups: whole``): allocation in units of a group.

A key/value group of grouped-query attention is its ``n_rep`` query heads and the key/value head they
read. Dropping query heads one at a time (``free``) leaves groups of unequal sizes, which the pruned
model serves by gathering key/value heads through a per-layer index (``liar_kv_indexed``); a stock
attention, a serving engine and a stock checkpoint all need equal groups. Under ``whole`` a layer
drops query heads only as complete groups, so every pruned layer is a stock GQA attention with
``n_rep`` query heads per key/value head.

This is the ordinary allocation run on a *group view* of the model: each group stands as one "head"
(its query heads' parameters plus its k/v rows; a score that sums its heads' scores, or averages them
when scores are standardised, as FLAP's AL-AM are; per-sample mask gradients summed, since one mask
multiplies the whole group), no separate key/value unit. Uniform, global and Kwon et al.'s search,
the rounding (``round_to``: kept query heads a multiple of ``heads``, which becomes a multiple of
``heads / gcd(heads, n_rep)`` groups) and the rearrangement then need no change, and the budget a
coarse group leaves or takes is spent in neurons exactly as any other rounding is. The plan is
expanded back to query heads at the end.
"""

from __future__ import annotations

import math
from dataclasses import replace

from core.allocation.plan import Budget, LayerPlan, Plan, allocate, max_ratio
from core.criteria.base import Scores
from core.models.adapter import Adapter

KV_GROUPS = ("free", "whole")


def has_groups(adapter: Adapter) -> bool:
    """Whether the model has key/value groups of more than one query head (else whole = free)."""
    return adapter.family.gqa and adapter.n_rep > 1


def group_scores(s: Scores, n_rep: int) -> Scores:
    """One score per key/value group (see the module docstring)."""
    heads = s.heads.reshape(-1, n_rep)
    samples = s.head_samples
    if samples is not None:
        samples = samples.reshape(samples.shape[0], -1, n_rep).sum(-1)
    return replace(s, heads=heads.mean(1) if s.comparable else heads.sum(1), head_samples=samples)


def group_costs(c: dict[str, int], n_rep: int) -> dict[str, int]:
    """A group's parameters: its query heads' (q rows, o columns) and its k/v rows."""
    return {"head": n_rep * c["head"] + c["kv"], "kv": 0, "neuron": c["neuron"]}


def expand(lp: LayerPlan, n_rep: int) -> LayerPlan:
    """A group-view layer plan as query heads and key/value heads."""
    groups = sorted(lp.heads)
    heads = [g * n_rep + r for g in groups for r in range(n_rep)]
    return LayerPlan(heads, groups, lp.neurons, lp.removed)


def allocate_groups(
    scores: list[Scores], adapter: Adapter, costs: list[dict[str, int]], layer_params: list[int], budget: Budget
) -> Plan:
    """:func:`~core.allocation.plan.allocate` keeping whole key/value groups in every layer (same
    arguments); the plain allocation for models without groups of several query heads."""
    if not has_groups(adapter):
        return allocate(scores, adapter, costs, layer_params, budget)
    n_rep = adapter.n_rep
    view = replace(adapter, n_heads=adapter.n_kv_heads)
    m_heads, m_neurons = budget.round_to
    # head_ratio of the groups: a uniform layer drops round(h · n_kv_heads) whole groups
    grouped = replace(budget, round_to=(m_heads // math.gcd(m_heads, n_rep), m_neurons))
    try:
        plan = allocate(
            [group_scores(s, n_rep) for s in scores],
            view,
            [group_costs(c, n_rep) for c in costs],
            layer_params,
            grouped,
        )
    except ValueError as exc:  # the reachable ratio: a layer keeps a whole group, not one head
        raise ValueError(str(exc).replace("keeps one head", "keeps one whole key/value group")) from None
    plan.layers = [expand(lp, n_rep) for lp in plan.layers]
    return plan


def whole_groups_reach(
    scores: list[Scores], adapter: Adapter, costs: list[dict[str, int]], layer_params: list[int], modules: str
) -> float:
    """The largest ratio a plan of whole key/value groups can reach (every layer keeps one group)."""
    if not has_groups(adapter):
        return max_ratio(adapter, modules, costs, sum(layer_params), scores)
    view = replace(adapter, n_heads=adapter.n_kv_heads)
    n_rep = adapter.n_rep
    grouped = [group_scores(s, n_rep) for s in scores]
    return max_ratio(view, modules, [group_costs(c, n_rep) for c in costs], sum(layer_params), grouped)


def kv_index_layers(plan: Plan, adapter: Adapter) -> int:
    """Layers of ``plan`` whose kept query heads do not form equal key/value groups: the pruned model
    gathers their key/value heads by index (0 under ``whole``)."""
    if not adapter.family.gqa:
        return 0
    n_rep = adapter.n_rep
    return sum(len({sum(h // n_rep == g for h in lp.heads) for g in lp.kv_heads}) > 1 for lp in plan.layers)
