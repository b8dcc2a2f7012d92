"""``head_ratio``: how a uniform layer splits its share between query heads and FFN neurons."""

import pytest
import torch
from pydantic import ValidationError

from core.allocation import Budget, allocate
from core.allocation.groups import allocate_groups
from core.allocation.plan import head_fraction
from core.spec.recipe import Recipe
from tests.conftest import recipe_for
from tests.core.allocation.test_kv_groups import SMOL, SMOL_COSTS, SMOL_LAYER, _smol_scores, _whole

N = 30


def _reference_layer(scores, ratio: float, h: float) -> tuple[list[int], int]:
    """A uniform layer written plainly: drop the ``round(h · 9)`` lowest-scored heads (fewer while they
    alone remove more than the layer's share, more while all neurons but one cannot make up the rest),
    then try every neuron count and keep
    the one whose total lands closest to the share; returns (kept heads, kept neurons)."""
    share = ratio * SMOL_LAYER
    order = sorted(range(9), key=lambda i: (scores.heads[i].item(), i))

    def removed(k: int, n: int) -> int:
        kv_gone = 3 - len({h // 3 for h in order[k:]})
        return k * SMOL_COSTS["head"] + kv_gone * SMOL_COSTS["kv"] + n * SMOL_COSTS["neuron"]

    k = min(round(h * 9), 8)
    while k > 0 and removed(k, 0) > share:
        k -= 1
    while k < 8 and removed(k, 1535) < share:  # the neurons alone cannot make up the rest
        k += 1
    n = min(range(1536), key=lambda n: (abs(removed(k, n) - share), n))
    return sorted(order[k:]), 1536 - n


@pytest.mark.parametrize("ratio", [0.1, 0.2, 0.5, 0.7])
@pytest.mark.parametrize("head_ratio", ["same", "auto", 0.0, 0.3, 0.9])
def test_uniform_split_equals_plain_reference(ratio, head_ratio):
    scores = _smol_scores()
    plan = allocate(scores, SMOL, [SMOL_COSTS] * N, [SMOL_LAYER] * N, Budget(ratio=ratio, head_ratio=head_ratio))
    h = {"same": ratio, "auto": ratio / 2}.get(head_ratio, head_ratio)
    for lp, s in zip(plan.layers, scores):
        heads, neurons = _reference_layer(s, ratio, h)
        assert (lp.heads, len(lp.neurons)) == (heads, neurons)
    assert abs(plan.deviation) <= 0.005


def test_auto_keeps_more_heads_than_same_for_the_same_parameters():
    """The point of the default: at 50% SmolLM2's layers keep 7 heads instead of 5, and more neurons go."""
    args = (_smol_scores(), SMOL, [SMOL_COSTS] * N, [SMOL_LAYER] * N)
    same = allocate(*args, Budget(ratio=0.5, head_ratio="same"))
    auto = allocate(*args, Budget(ratio=0.5, head_ratio="auto"))
    assert {len(lp.heads) for lp in same.layers} == {5} and {len(lp.heads) for lp in auto.layers} == {7}
    assert all(len(a.neurons) < len(s.neurons) for a, s in zip(auto.layers, same.layers))
    assert abs(auto.removed - same.removed) <= N * SMOL_COSTS["neuron"]


@pytest.mark.parametrize(("head_ratio", "groups_left"), [("same", 1), ("auto", 2), (0.0, 3)])
def test_whole_groups_split_by_groups(head_ratio, groups_left):
    """Under whole key/value groups the fraction counts groups: 50% drops round(1.5) = 2 of SmolLM2's 3
    groups with the paper's split, round(0.75) = 1 with auto, and neurons make up the rest."""
    budget = Budget(ratio=0.5, round_to=(1, 64), head_ratio=head_ratio)
    plan = allocate_groups(_smol_scores(), SMOL, [SMOL_COSTS] * N, [SMOL_LAYER] * N, budget)
    assert all(_whole(lp, 3) and len(lp.kv_heads) == groups_left for lp in plan.layers)
    assert all(len(lp.neurons) % 64 == 0 for lp in plan.layers) and abs(plan.deviation) <= 0.005


def test_global_allocation_ignores_the_split():
    args = (_smol_scores(), SMOL, [SMOL_COSTS] * N, [SMOL_LAYER] * N)
    same = allocate(*args, Budget(ratio=0.3, allocation="global", head_ratio="same"))
    auto = allocate(*args, Budget(ratio=0.3, allocation="global", head_ratio="auto"))
    assert [lp.heads for lp in same.layers] == [lp.heads for lp in auto.layers]
    assert [lp.neurons.tolist() for lp in same.layers] == [lp.neurons.tolist() for lp in auto.layers]


def test_head_fraction_and_recipe_validation(llama_dir, corpus):
    assert head_fraction(0.4, "same") == 0.4 and head_fraction(0.4, "auto") == 0.2 and head_fraction(0.4, 0.1) == 0.1
    with pytest.raises(ValueError, match="head_ratio must be"):
        head_fraction(0.4, 1.0)
    assert Recipe.model_validate(recipe_for(llama_dir, corpus)).head_ratio == "auto"
    assert Recipe.model_validate(recipe_for(llama_dir, corpus, head_ratio=0.25)).head_ratio == 0.25
    for bad in (1.0, -0.1, "half", True):
        with pytest.raises(ValidationError, match="head_ratio"):
            Recipe.model_validate(recipe_for(llama_dir, corpus, head_ratio=bad))


def test_pruned_model_follows_the_split(llama_dir, corpus):
    """End to end on the tiny LLaMA (8 heads): at 50% the default keeps 6 heads per layer, the paper's
    split 4, for the same parameter budget."""
    from core import prune

    auto = prune(recipe_for(llama_dir, corpus, ratio=0.5, round_to={"neurons": 1}))
    same = prune(recipe_for(llama_dir, corpus, ratio=0.5, head_ratio="same", round_to={"neurons": 1}))
    assert {len(lp.heads) for lp in auto.plan.layers} == {6} and {len(lp.heads) for lp in same.plan.layers} == {4}
    assert abs(auto.achieved_ratio - same.achieved_ratio) < 0.02
    assert (auto.summary()["kept_heads_mean"], same.summary()["kept_heads_mean"]) == (6, 4)
    assert auto.summary()["kept_neurons_mean"] < same.summary()["kept_neurons_mean"]
    for result in (auto, same):
        q = result.adapter.layers(result.model)[0].self_attn.q_proj
        assert q.weight.shape[0] == len(result.plan.layers[0].heads) * result.adapter.head_dim
    assert torch.isfinite(auto.model(torch.tensor([[1, 2, 3]])).logits).all()


def test_more_heads_go_when_the_neurons_cannot_make_up_the_share(opt_dir, corpus):
    """The tiny OPT's attention is most of a layer (8 heads of 2,072 parameters, 48 neurons of 129):
    at 50% half the ratio in heads (2) plus every neuron but one falls short of the share, so the
    layer drops more heads and the ratio is still met (before, the plan stopped at 44%)."""
    from core import prune

    result = prune(recipe_for(opt_dir, corpus, ratio=0.5, round_to={"neurons": 1}))
    assert abs(result.achieved_ratio - 0.5) < 0.01
    assert all(len(lp.heads) < 6 for lp in result.plan.layers)
