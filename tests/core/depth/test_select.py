"""Span selection against the surgery it stands for, and depth pruning as a recipe (prune → save → reload)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from core import prune
from core.depth.replace import DepthError, fit_spans
from core.depth.select import apply_span, choose_span, held_loss, held_losses
from core.models.adapter import adapter_for, block_parameters
from core.models.tiny import tiny_decoder
from core.pipeline.preflight import check_model_fit, width_ratio
from core.spec.recipe import Recipe
from tests.conftest import recipe_for


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """Six blocks with an FFN wider than the residual stream, so that every span has a stand-in."""
    return tiny_decoder(tmp_path_factory.mktemp("deep") / "llama", num_hidden_layers=6, intermediate_size=96)


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _batches(vocab, n, seed, length=24):
    gen = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        for ids in (torch.randint(4, vocab, (3, length), generator=gen) for _ in range(n))
    ]


def _reference_loss(model, batches) -> float:
    """Mean next-token cross-entropy in float64 from the logits, token by token."""
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logp = torch.log_softmax(model(**b).logits.double(), -1)
            ids = b["input_ids"]
            for i in range(ids.shape[0]):
                for t in range(ids.shape[1] - 1):
                    total -= float(logp[i, t, ids[i, t + 1]])
                    count += 1
    return total / count


def test_held_loss_equals_float64_reference(deep_dir):
    model = _load(deep_dir)
    batches = _batches(model.config.vocab_size, 2, seed=1)
    assert held_loss(model, adapter_for(model), batches) == pytest.approx(_reference_loss(model, batches), rel=1e-5)


def test_held_losses_are_those_of_the_models_cut_for_good_and_leave_the_model_as_it_was(deep_dir):
    """One walk along the blocks gives, for every candidate and stand-in (folded, or the span just left
    out), the float64 loss of a copy cut for good; the model is the dense one afterwards, bit for bit."""
    from core.depth.replace import fold, remove_blocks

    model = _load(deep_dir)
    adapter = adapter_for(model)
    fit, held = _batches(model.config.vocab_size, 3, seed=2), _batches(model.config.vocab_size, 2, seed=3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    stand_ins = {
        s: {"folded": fit_spans(model, adapter, fit, [(s, s + 2)])[(s, s + 2)][0].solve(0.01).float(), "none": None}
        for s in (1, 2, 4)  # a gap in the starts: the dense states advance past block 2 untouched
    }
    losses = held_losses(model, adapter, held, 2, stand_ins)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert len(adapter.layers(model)) == 6
    assert losses.keys() == stand_ins.keys()
    for s, variants in stand_ins.items():
        for key, t in variants.items():
            cut = copy.deepcopy(model)
            if t is not None:
                fold(cut, adapter, s, t)
            remove_blocks(cut, adapter, [s, s + 1])
            assert losses[s][key] == pytest.approx(_reference_loss(cut, held), rel=1e-5), (s, key)


def test_held_losses_keep_each_blocks_own_layer_type(tmp_path):
    """Qwen2 with sliding-window and full-attention blocks alternating: with one block left out, the
    blocks after it sit at positions of the other type, yet each keeps its own mask, as in the model
    cut for good (whose config's layer types are trimmed)."""
    types = ["sliding_attention", "full_attention"] * 3
    path = tiny_decoder(
        tmp_path / "qwen2", "qwen2", num_hidden_layers=6, use_sliding_window=True, sliding_window=8,
        max_window_layers=0, layer_types=types,
    )  # fmt: skip
    model = _load(path)
    adapter = adapter_for(model)
    held = _batches(model.config.vocab_size, 2, seed=8)
    inside = held_losses(model, adapter, held, 1, {2: {"loss": None}})[2]["loss"]
    assert model.config.layer_types == types
    cut = copy.deepcopy(model)
    from core.depth.replace import remove_blocks

    remove_blocks(cut, adapter, [2])
    assert cut.config.layer_types == types[:2] + types[3:]
    assert inside == pytest.approx(_reference_loss(cut, held), rel=1e-5)
    # and the type really matters here: the cut model with its types left untrimmed scores otherwise
    cut.config.layer_types = types[:5]
    assert held_loss(cut, adapter, held) != pytest.approx(inside, rel=1e-4)


@pytest.mark.parametrize("reconstruction", ["ls", "none"])
def test_loss_selection_picks_the_span_whose_cut_model_scores_best(deep_dir, reconstruction):
    model = _load(deep_dir)
    adapter = adapter_for(model)
    fit, held = _batches(model.config.vocab_size, 3, seed=4), _batches(model.config.vocab_size, 2, seed=5)
    choice = choose_span(model, adapter, fit, held, 2, "loss", reconstruction)
    assert sorted(choice.candidates) == [1, 2, 3, 4]
    # every candidate's loss is the loss of the model cut that way, by a separate copy
    for start, cand in choice.candidates.items():
        cut = copy.deepcopy(model)
        if reconstruction == "ls":
            weighted = cand["loss_weighted"] <= cand["loss_plain"]
            t = fit_spans(cut, adapter, fit, [(start, start + 2)], normalise=weighted)[(start, start + 2)][0]
            from core.depth.replace import fold

            fold(cut, adapter, start, t.solve(0.01).float())
        from core.depth.replace import remove_blocks

        remove_blocks(cut, adapter, [start, start + 1])
        assert cand["loss"] == pytest.approx(_reference_loss(cut, held), rel=1e-4)
    best = min(choice.candidates, key=lambda s: choice.candidates[s]["loss"])
    assert (choice.start, choice.end) == (best, best + 2)
    assert (choice.t is None) == (reconstruction == "none")
    apply_span(model, adapter, choice)
    assert model.config.num_hidden_layers == 4 and len(adapter.layers(model)) == 4
    assert held_loss(model, adapter, held) == pytest.approx(choice.candidates[best]["loss"], rel=1e-5)


@pytest.mark.parametrize("select, key", [("angular", "angular_distance"), ("fit", "fit_error")])
def test_local_selections_pick_their_least_score(deep_dir, select, key):
    model = _load(deep_dir)
    adapter = adapter_for(model)
    fit = _batches(model.config.vocab_size, 2, seed=6)
    choice = choose_span(model, adapter, fit, fit, 3, select)
    assert choice.start == min(choice.candidates, key=lambda s: choice.candidates[s][key])
    assert "loss" not in choice.candidates[choice.start]


@pytest.mark.parametrize("blocks", [0, 5, 6])
def test_span_lengths_outside_the_model_are_refused(deep_dir, blocks):
    model = _load(deep_dir)
    fit = _batches(model.config.vocab_size, 1, seed=7)
    with pytest.raises(DepthError, match="can lose 1 to 4"):
        choose_span(model, adapter_for(model), fit, fit, blocks)


def _depth_recipe(path, corpus, **kw):
    r = recipe_for(path, corpus, **kw)
    r["reconstruction"] = {"method": "ls", "damp": 0.001}
    return r


def test_depth_only_run_saves_a_stock_checkpoint_with_fewer_layers(deep_dir, corpus, tmp_path):
    result = prune(_depth_recipe(deep_dir, corpus, modules="blocks", ratio=0.34))
    assert result.model.config.num_hidden_layers == 4  # round(0.34 × 6) = 2 blocks
    assert len(result.metrics["depth_blocks_removed"]) == 2
    assert result.achieved_ratio == pytest.approx(2 / 6)
    out = result.save(tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "LlamaForCausalLM" and reloaded.config.num_hidden_layers == 4
    ids = torch.randint(4, reloaded.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, result.model(ids).logits, atol=1e-5)


def test_depth_and_width_together_reach_the_ratio(deep_dir, corpus, tmp_path):
    result = prune(_depth_recipe(deep_dir, corpus, ratio=0.5, depth={"blocks": 1}, criterion={"name": "magnitude"}))
    assert result.model.config.num_hidden_layers == 5
    assert result.metrics["width_ratio"] == pytest.approx(width_ratio(0.5, 1 / 6), abs=1e-6)
    assert result.recipe.ratio == 0.5 and result.recipe.depth.blocks == 1
    assert abs(result.achieved_ratio - 0.5) < 0.05
    assert len(result.plan.layers) == 5
    out = result.save(tmp_path / "out")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=True).eval()
    ids = torch.randint(4, reloaded.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, result.model(ids).logits, atol=1e-5)
    assert block_parameters(reloaded, adapter_for(reloaded)) == result.block_params_after


def test_width_ratio_keeps_the_total():
    share = 8 / 30
    w = width_ratio(0.5, share)
    assert share + (1 - share) * w == pytest.approx(0.5)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"modules": "blocks", "ratio": 0.99}, "at most 4 can go, 6 asked"),
        ({"ratio": 0.3, "depth": {"blocks": 2}}, "leaves the heads and neurons nothing to remove"),
    ],
)
def test_depth_that_cannot_fit_the_model_is_refused_before_any_work(deep_dir, corpus, fields, message):
    recipe = Recipe.model_validate(_depth_recipe(deep_dir, corpus, **fields))
    config = _load(deep_dir).config
    with pytest.raises(ValueError, match=message):
        check_model_fit(recipe, config)


def test_depth_refusals_in_the_recipe(deep_dir, corpus):
    with pytest.raises(ValueError, match="give one or the other"):
        Recipe.model_validate(_depth_recipe(deep_dir, corpus, modules="blocks", depth={"blocks": 2}))
    # depth streams (tests/core/pipeline/test_streamed_depth.py); a speed target still compares in memory
    streamed = Recipe.model_validate(_depth_recipe(deep_dir, corpus, depth={"blocks": 1}, execution="stream"))
    assert streamed.execution == "stream" and streamed.removes_blocks
    with pytest.raises(ValueError, match="compares whole pruned models in memory"):
        Recipe.model_validate(
            {**_depth_recipe(deep_dir, corpus, execution="stream"), "ratio": None, "target": {"speedup": 1.5}}
        )


def test_gemma_refuses_the_folded_stand_in_but_takes_plain_removal(tmp_path, corpus):
    layer_types = ["sliding_attention", "full_attention"] * 2
    path = tiny_decoder(tmp_path / "gemma3", family="gemma3", num_hidden_layers=4, layer_types=layer_types)
    config = _load(path).config
    with pytest.raises(ValueError, match="depth.reconstruction none"):
        check_model_fit(Recipe.model_validate(_depth_recipe(path, corpus, modules="blocks", ratio=0.25)), config)
    plain = Recipe.model_validate(
        _depth_recipe(path, corpus, modules="blocks", ratio=0.25, depth={"reconstruction": "none"})
    )
    check_model_fit(plain, config)
    result = prune(plain)
    assert result.model.config.num_hidden_layers == 3
    assert math.isfinite(result.metrics["depth_loss"])
