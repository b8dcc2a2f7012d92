"""The plan the block loop follows: the kept widths' multiples, the key/value grouping and the
allocation of each layer's keep-sets, resolved for the model and the device."""

from __future__ import annotations

import math

import torch
from torch import nn

from core import criteria
from core.allocation import Budget, Plan, allocate
from core.allocation.groups import allocate_groups, whole_groups_reach
from core.allocation.plan import auto_multiple, prunable
from core.allocation.split import SplitState
from core.criteria import Scores
from core.models.adapter import Adapter, unit_costs
from core.spec.recipe import Recipe

K_BLOCK = 256  # llama.cpp's K- and i-quant block length


def round_to(recipe: Recipe, adapter: Adapter, device: torch.device) -> tuple[int, int]:
    """``(heads, neurons)`` multiples of the kept widths, ``auto`` resolved for this model and device;
    ``k_quant``: the multiples that keep the attention output's rows (heads × head_dim) and the down
    projection's (neurons) 256 long, each where the model has that many to keep."""
    neurons, heads = recipe.round_to.neurons, recipe.round_to.heads
    if recipe.round_to.k_quant:
        neurons = math.lcm(K_BLOCK, 1 if neurons == "auto" else neurons)
        neurons = neurons if neurons <= adapter.n_neurons else recipe.round_to.neurons
        per_block = K_BLOCK // math.gcd(K_BLOCK, adapter.head_dim)
        heads = math.lcm(heads, per_block) if math.lcm(heads, per_block) <= adapter.n_heads else heads
    if neurons == "auto":
        neurons = auto_multiple(adapter.n_neurons, device.type)
    return heads, int(neurons)


def resolved_kv_groups(
    recipe: Recipe,
    device: torch.device,
    model: nn.Module | None = None,
    adapter: Adapter | None = None,
    scores: list[Scores] | None = None,
) -> str:
    """``round_to.kv_groups`` resolved for the device: ``whole`` or ``free`` (``auto``: whole on a GPU,
    free on a CPU). A model without groups of several query heads is pruned the same either way.

    Given the model, ``auto`` also stays ``free`` on a GPU where whole groups would not serve: a
    single key/value head (multi-query attention) is shared by every kept query head anyway, so free
    pruning keeps a stock attention while whole groups could drop no head at all; and a ratio that
    whole groups cannot reach (each layer keeps one group) is pruned with free heads rather than
    refused."""
    choice = recipe.round_to.kv_groups
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "free"
    if adapter is not None and adapter.family.gqa and adapter.n_kv_heads < 2:
        return "free"
    if model is not None and adapter is not None and scores is not None:
        if recipe.ratio > whole_groups_reach(scores, adapter, *layer_budget(model, adapter), recipe.modules):
            return "free"
    return "whole"


def layer_budget(model: nn.Module, adapter: Adapter) -> tuple[list[dict[str, int]], list[int]]:
    """Each layer's unit costs and parameter count, as the allocation takes them."""
    layers = adapter.layers(model)
    return [unit_costs(layer, adapter) for layer in layers], [
        sum(p.numel() for p in layer.parameters()) for layer in layers
    ]


def make_plan(
    model: nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    scores: list[Scores],
    rounding: tuple[int, int],
    groups: str = "free",
) -> Plan:
    """The plan of ``recipe`` for these scores; ``groups``: the resolved ``round_to.kv_groups``."""
    budget = Budget(
        ratio=recipe.ratio,
        modules=recipe.modules,
        allocation=recipe.allocation,
        round_to=rounding,
        global_search=criteria.get(recipe.criterion.name).global_search,
        head_ratio=recipe.head_ratio,
        uniform_heads=recipe.query_heads == "uniform",
    )
    return (allocate_groups if groups == "whole" else allocate)(scores, adapter, *layer_budget(model, adapter), budget)


def obs_split(
    model: nn.Module, adapter: Adapter, recipe: Recipe, scores: list[Scores], rounding: tuple[int, int], groups: str
) -> SplitState | None:
    """``head_ratio: obs``'s state for the block loop, or None when the recipe has no per-layer split
    to choose (another head_ratio, global allocation, or only heads or only neurons pruned)."""
    if recipe.head_ratio != "obs" or recipe.allocation != "uniform" or recipe.modules != "both":
        return None
    return SplitState(
        costs=[unit_costs(layer, adapter) for layer in adapter.layers(model)],
        multiple=rounding[1],
        whole=groups == "whole",
        prunable=[all(prunable(s, recipe.modules)) for s in scores],
    )
