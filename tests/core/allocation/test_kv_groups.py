"""Whole key/value groups (``round_to.kv_groups: whole``): plans, selection, the pruned model, export."""

import copy

import pytest
import torch
from pydantic import ValidationError

from core import criteria, prune
from core.allocation import Budget, allocate
from core.allocation.groups import allocate_groups, whole_groups_reach
from core.allocation.plan import max_ratio
from core.criteria import Scores
from core.models.adapter import Adapter, adapter_for, unit_costs
from core.models.liar_families import FAMILIES
from core.pipeline.planning import make_plan, resolved_kv_groups
from core.spec.recipe import Recipe
from tests.conftest import recipe_for
from tests.core.models.test_surgery import _mask_dense
from tests.core.pipeline.test_pipeline import _logits, slow_reference

# SmolLM2-135M's geometry: 30 layers of 9 query heads over 3 key/value heads of 64, FFN 1536
SMOL = Adapter("llama", FAMILIES["llama"], "decoder", 9, 3, 64, 576, 1536, 30)
SMOL_COSTS = {"head": 64 * 2 * 576, "kv": 64 * 2 * 576, "neuron": 3 * 576}
SMOL_LAYER = 9 * SMOL_COSTS["head"] + 3 * SMOL_COSTS["kv"] + 1536 * SMOL_COSTS["neuron"] + 2 * 576


def _smol_scores(samples: bool = False) -> list[Scores]:
    gen = torch.Generator().manual_seed(0)
    return [
        Scores(
            heads=torch.rand(9, generator=gen, dtype=torch.float64),
            neurons=torch.rand(1536, generator=gen, dtype=torch.float64),
            # per-sample gradients of the head masks: Kwon et al.'s rearrangement (of whole groups here);
            # the neurons' (an O(n²) greedy over 1536 neurons per layer) would add nothing but time
            head_samples=torch.randn(16, 9, generator=gen) if samples else None,
        )
        for _ in range(30)
    ]


def _whole(lp, n_rep: int) -> bool:
    """Every kept key/value group keeps all its query heads, and only those."""
    return lp.heads == [g * n_rep + r for g in lp.kv_heads for r in range(n_rep)]


@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.5])
# kept query heads: any number of groups; multiples of 3 (the same); of 6 (2 of the 3 groups, a head count
# the plan did not choose, whose parameters the neurons then make up for)
@pytest.mark.parametrize("rounding", [(1, 1), (1, 64), (3, 64), (6, 64), (6, 1)])
@pytest.mark.parametrize(
    ("allocation", "search", "samples"),
    [("uniform", "threshold", False), ("global", "threshold", False), ("global", "fisher", True)],
)
def test_plans_keep_whole_groups_within_half_a_point(ratio, rounding, allocation, search, samples):
    """Every allocation (Kwon et al.'s search and rearrangement too) keeps whole groups in every layer,
    and spends what the coarse groups leave in neurons: the ratio lands within ±0.5 points."""
    n = len(_smol_scores())
    budget = Budget(ratio=ratio, allocation=allocation, round_to=rounding, global_search=search)
    plan = allocate_groups(_smol_scores(samples), SMOL, [SMOL_COSTS] * n, [SMOL_LAYER] * n, budget)
    assert all(_whole(lp, SMOL.n_rep) for lp in plan.layers)
    assert abs(plan.deviation) <= 0.005
    assert all(len(lp.neurons) % rounding[1] == 0 for lp in plan.layers)
    assert all(len(lp.heads) % rounding[0] == 0 for lp in plan.layers)
    removed = [
        (9 - len(lp.heads)) * SMOL_COSTS["head"]
        + (3 - len(lp.kv_heads)) * SMOL_COSTS["kv"]
        + (1536 - len(lp.neurons)) * SMOL_COSTS["neuron"]
        for lp in plan.layers
    ]
    assert [lp.removed for lp in plan.layers] == removed  # the parameter count of the expanded plan
    if allocation == "uniform" and rounding[0] in (1, 3):  # round(ratio × 3) groups go from every layer
        assert {len(lp.kv_heads) for lp in plan.layers} == {3 - round(ratio * 3)}


def test_free_plans_leave_uneven_groups_that_whole_plans_avoid():
    """The situation the option is for: SmolLM2 at 20% drops 2 of 9 query heads per layer."""
    n = 30
    args = ([SMOL_COSTS] * n, [SMOL_LAYER] * n, Budget(ratio=0.2))
    free = allocate(_smol_scores(), SMOL, *args)
    whole = allocate_groups(_smol_scores(), SMOL, *args)
    assert not any(_whole(lp, 3) for lp in free.layers)  # 7 of 9 heads: never whole groups
    assert all(len(lp.heads) == 6 and len(lp.kv_heads) == 2 for lp in whole.layers)


def test_uneven_layers_are_counted(llama_dir, corpus):
    """The summary says how many layers gather key/value heads by index (a free prune may leave some)."""
    result = prune(recipe_for(llama_dir, corpus, ratio=0.4, allocation="global"))
    uneven = sum(len({sum(h // 2 == g for h in lp.heads) for g in lp.kv_heads}) > 1 for lp in result.plan.layers)
    indexed = sum(
        getattr(layer.get_submodule(result.adapter.family.attn), "liar_kv_index", None) is not None
        for layer in result.adapter.layers(result.model)
    )
    assert result.summary()["kv_index_layers"] == uneven == indexed > 0
    assert result.summary()["round_to_kv_groups"] == "free"


def test_unreachable_ratio_names_the_whole_group():
    n = 30
    with pytest.raises(ValueError, match="keeps one whole key/value group"):
        allocate_groups(_smol_scores(), SMOL, [SMOL_COSTS] * n, [SMOL_LAYER] * n, Budget(ratio=0.3, modules="heads"))


def test_recipe_option_validates_and_auto_follows_the_device(llama_dir, corpus):
    assert Recipe.model_validate(recipe_for(llama_dir, corpus)).round_to.kv_groups == "free"  # the default
    with pytest.raises(ValidationError, match="Input should be 'free', 'whole' or 'auto'"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, round_to={"kv_groups": "some"}))
    auto = Recipe.model_validate(recipe_for(llama_dir, corpus, round_to={"kv_groups": "auto"}))
    assert resolved_kv_groups(auto, torch.device("cpu")) == "free"
    assert resolved_kv_groups(auto, torch.device("cuda")) == "whole"


def test_auto_stays_free_on_a_gpu_where_whole_groups_do_not_serve(tmp_path, corpus):
    """Multi-query attention (one key/value head): whole groups could drop no query head, free pruning
    keeps a stock attention anyway. A ratio whole groups cannot reach: free heads instead of a refusal."""
    from core.models.loading import load_model
    from core.models.tiny import tiny_decoder

    cuda = torch.device("cuda")  # resolution only: nothing runs on it
    for kv, ratio, expected in ((1, 0.2, "free"), (4, 0.2, "whole"), (4, 0.45, "whole")):
        model_dir = tiny_decoder(tmp_path / f"kv{kv}", num_key_value_heads=kv)
        recipe = Recipe.model_validate(recipe_for(model_dir, corpus, ratio=ratio, round_to={"kv_groups": "auto"}))
        model, _, _ = load_model(str(model_dir), "float32", "cpu")
        adapter = adapter_for(model)
        magnitude = criteria.get("magnitude")
        scores = [magnitude.score(layer, adapter, i, None) for i, layer in enumerate(adapter.layers(model))]
        assert resolved_kv_groups(recipe, cuda, model, adapter, scores) == expected, (kv, ratio)
    # 8 query heads over 4 groups: keeping one group of two heads caps what heads can give
    layers = adapter.layers(model)
    costs = [unit_costs(layer, adapter) for layer in layers]
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    reach = whole_groups_reach(scores, adapter, costs, sizes, "heads")
    free_reach = max_ratio(adapter, "heads", costs, sum(sizes), scores)
    assert reach < free_reach
    between = round((reach + free_reach) / 2, 4)
    beyond = Recipe.model_validate(
        recipe_for(
            model_dir, corpus, ratio=between, modules="heads", allocation="uniform", round_to={"kv_groups": "auto"}
        )
    )
    assert resolved_kv_groups(beyond, cuda, model, adapter, scores) == "free"
    with pytest.raises(ValueError, match="keeps one whole key/value group"):  # what whole would have said
        make_plan(model, adapter, beyond, scores, (1, 1), "whole")
    make_plan(model, adapter, beyond, scores, (1, 1), "free")  # reachable with free heads


def _stock_attention(result) -> bool:
    """No layer gathers key/value heads by index: each is a stock GQA attention with equal groups."""
    fam = result.adapter.family
    return all(
        getattr(layer.get_submodule(fam.attn), "liar_kv_index", None) is None
        and layer.get_submodule(fam.attn).num_key_value_groups == result.adapter.n_rep
        for layer in result.adapter.layers(result.model)
    )


@pytest.mark.parametrize("allocation", ["uniform", "global"])
def test_pipeline_with_whole_groups_equals_masking(allocation, llama_dir, corpus):
    """Without reconstruction the pruned model is the dense model with the dropped heads' and neurons'
    channels zeroed; every layer is a stock GQA attention; the summary names the choice."""
    recipe = recipe_for(
        llama_dir, corpus, ratio=0.4, allocation=allocation, round_to={"kv_groups": "whole"}, reconstruction={}
    )
    recipe["reconstruction"] = {"method": "none", "select": "criterion"}
    result = prune(recipe)
    assert result.summary()["round_to_kv_groups"] == "whole" and result.summary()["kv_index_layers"] == 0
    assert all(_whole(lp, result.adapter.n_rep) for lp in result.plan.layers)
    assert any(len(lp.heads) < result.adapter.n_heads for lp in result.plan.layers)
    assert _stock_attention(result)
    from core.models.loading import load_model

    dense, tok, adapter = load_model(str(llama_dir), "float32", "cpu")
    _mask_dense(dense, adapter, [lp.heads for lp in result.plan.layers], [lp.neurons for lp in result.plan.layers])
    with torch.no_grad():
        torch.testing.assert_close(
            _logits(result.model, tok, "decoder"), _logits(dense, tok, "decoder"), rtol=1e-5, atol=1e-5
        )


def test_pipeline_with_whole_groups_equals_slow_reference(llama_dir, corpus):
    recipe = Recipe.model_validate(
        recipe_for(
            llama_dir,
            corpus,
            ratio=0.4,
            round_to={"kv_groups": "whole"},
            reconstruction={"method": "ls", "damp": 1e-3},
            calibration={"holdout_samples": 0},
        )
    )
    result = prune(recipe)
    ref, _ = slow_reference(recipe, plan=copy.deepcopy(result.plan))
    with torch.no_grad():
        got, expected = _logits(result.model, result.tokenizer, "decoder"), _logits(ref, result.tokenizer, "decoder")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_obs_selection_chooses_whole_groups(llama_dir, corpus):
    """Reconstruction-aware selection keeps the plan's number of groups, picks which by the refit's
    statistics (any groups: they cost the same), and lowers the error of the criterion's choice."""
    base = recipe_for(llama_dir, corpus, ratio=0.4, round_to={"kv_groups": "whole"})
    plain = prune({**base, "reconstruction": {"method": "ls", "damp": 1e-3, "select": "criterion"}})
    obs = prune({**base, "reconstruction": {"method": "ls", "damp": 1e-3, "select": "obs"}})
    n_rep = obs.adapter.n_rep
    for a, b in zip(plain.plan.layers, obs.plan.layers):
        assert _whole(b, n_rep) and len(a.kv_heads) == len(b.kv_heads) and len(a.neurons) == len(b.neurons)
    assert obs.params_after == plain.params_after
    assert sum(r.error_after for r in obs.report) < sum(r.error_after for r in plain.report)
    assert _stock_attention(obs)


@pytest.mark.slow
def test_whole_groups_streamed_equals_in_memory_and_exports_stock(llama_dir, corpus, tmp_path):
    from tests.core.models.test_streaming import _assert_same_checkpoint

    recipe = recipe_for(
        llama_dir,
        corpus,
        ratio=0.5,
        device="cpu",
        head_ratio="same",  # 4 of 8 heads: a count that divides the hidden size, as a stock LLaMA config needs
        round_to={"neurons": 1, "kv_groups": "whole"},
        reconstruction={"method": "ls", "select": "obs"},
    )
    memory = prune({**recipe, "execution": "memory"})
    memory_dir = memory.save(tmp_path / "memory")
    streamed = prune({**recipe, "execution": "stream"}, output_dir=tmp_path / "stream")
    assert streamed.stock and streamed.summary()["kv_index_layers"] == 0
    _assert_same_checkpoint(memory_dir, streamed.save(tmp_path / "stream"))


def test_group_errors_of_smollm2_sized_groups():
    """Three 192-channel groups (SmolLM2's key/value groups as o_proj inputs): torch 2.13's batched LU
    solve failed on them with 2 CPU threads; the errors must equal one plain solve per group."""
    from core.stats.select import _unit_errors

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(576, 576, generator=gen, dtype=torch.float64)
    hinv = a @ a.T / 576 + torch.eye(576, dtype=torch.float64)
    w = torch.randn(576, 576, generator=gen, dtype=torch.float64)
    got = _unit_errors(w.T.contiguous(), hinv, torch.arange(3) * 192, 192)
    for u in range(3):
        ch = slice(192 * u, 192 * (u + 1))
        expected = (w[:, ch] * torch.linalg.solve(hinv[ch, ch], w[:, ch].T).T).sum()
        torch.testing.assert_close(got[u], expected)
