"""Criteria against hand computations on raw activations; FLAP's structures and their errors."""

import pytest
import torch
from pydantic import ValidationError

from core import prune
from core.criteria import score_layer
from core.data.calibration import decoder_windows, encoder_samples, load_texts
from core.models.loading import load_model
from core.pipeline.scoring import dense_inputs, split_batches
from core.spec.recipe import Recipe
from core.stats.accumulate import ChannelStats
from core.stats.reconstruct import METHODS
from tests.conftest import fast_first, recipe_for


def test_channel_stats_equal_two_pass_variance():
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(2, 9, 6, generator=gen) * 3 + 5 for _ in range(5)]
    masks = [torch.rand(2, 9, generator=gen) > 0.4 for _ in range(5)]
    stats = ChannelStats(6)
    for x, m in zip(batches, masks):
        stats.add_batch(x, m)
    raw = torch.cat([x[m] for x, m in zip(batches, masks)]).double()
    torch.testing.assert_close(stats.mean, raw.mean(0))
    torch.testing.assert_close(stats.variance, raw.var(0, unbiased=True))  # two-pass reference
    torch.testing.assert_close(stats.mean_square, (raw**2).mean(0))


def _raw_inputs(model, adapter, fit):
    """Raw o_proj / down_proj inputs of every layer on the dense model (padding removed)."""
    fam, store = adapter.family, {}
    hooks = []
    for i, layer in enumerate(adapter.layers(model)):
        for key, path in (("attn", fam.o), ("ffn", fam.ffn_out)):
            hooks.append(
                layer.get_submodule(path).register_forward_pre_hook(
                    lambda _m, a, k=(i, key): store.setdefault(k, []).append(a[0].detach())
                )
            )
    with torch.no_grad():
        model.base_model(input_ids=fit.input_ids, attention_mask=fit.attention_mask)
    for h in hooks:
        h.remove()
    mask = fit.attention_mask.bool()
    return {
        k: torch.cat(v)[mask].double()
        if adapter.kind == "encoder"
        else torch.cat(v).reshape(-1, v[0].shape[-1]).double()
        for k, v in store.items()
    }


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("metric", ["IFV", "WIFV", "WIFN"])
def test_flap_scores_match_hand_computation(name, metric, model_dirs, corpus):
    recipe = Recipe.model_validate(recipe_for(model_dirs[name], corpus))
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    cal = recipe.calibration
    fit, _ = (decoder_windows if adapter.kind == "decoder" else encoder_samples)(load_texts(cal), tok, cal)
    inputs = dense_inputs(model, adapter, split_batches(fit, 5), torch.device("cpu"))  # streamed in batches
    raw = _raw_inputs(model, adapter, fit)  # one pass, all tokens in memory
    fam = adapter.family
    for i, layer in enumerate(adapter.layers(model)):

        def ref(x, w):
            w = w.double()
            if metric == "IFV":
                return x.var(0)
            if metric == "WIFV":
                return x.var(0) * (w**2).sum(0)
            return (w.abs() * (x**2).mean(0).sqrt()).mean(0)

        a = ref(raw[(i, "attn")], layer.get_submodule(fam.o).weight) ** 2
        f = ref(raw[(i, "ffn")], layer.get_submodule(fam.ffn_out).weight)
        got = score_layer("flap", layer, adapter, i, {"metric": metric}, inputs[i])
        torch.testing.assert_close(got.heads.double(), a.reshape(adapter.n_heads, -1).sum(1), rtol=1e-4, atol=1e-8)
        torch.testing.assert_close(got.neurons.double(), f, rtol=1e-4, atol=1e-8)
        adaptive = score_layer("flap", layer, adapter, i, {"metric": metric, "structure": "AL-AM"}, inputs[i])
        za = (a - a.mean()) / a.std()
        torch.testing.assert_close(
            adaptive.heads.double(), za.reshape(adapter.n_heads, -1).mean(1), rtol=1e-4, atol=1e-6
        )
        torch.testing.assert_close(adaptive.neurons.double(), (f - f.mean()) / f.std(), rtol=1e-4, atol=1e-6)
        assert adaptive.comparable and not got.comparable


def test_magnitude_matches_appendix_formula(llama_dir):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    layer = adapter.layers(model)[0]
    s = score_layer("magnitude", layer, adapter, 0, {})
    w_down = layer.mlp.down_proj.weight.T  # paper layout (C_in, C_out): s_k = Σ_i W_{k,i}²
    torch.testing.assert_close(s.neurons, (w_down**2).sum(1))
    w_o = layer.self_attn.o_proj.weight.T
    torch.testing.assert_close(s.heads, (w_o**2).sum(1).reshape(adapter.n_heads, -1).sum(1))


@pytest.mark.parametrize("method", fast_first(2, sorted(METHODS)))
@pytest.mark.parametrize("name", fast_first(1, ["llama", "qwen2", "bert"]))
def test_flap_runs_end_to_end(name, method, model_dirs, corpus):
    for structure, allocation in (("UL-UM", "uniform"), ("AL-AM", "global")):
        result = prune(
            recipe_for(
                model_dirs[name],
                corpus,
                ratio=0.3,
                allocation=allocation,
                criterion={"name": "flap", "options": {"structure": structure}},
                reconstruction={"method": method, "damp": 1e-3},
            )
        )
        assert result.plan.ratio == pytest.approx(0.3, abs=0.05)


def test_flap_adaptive_structure_can_prune_layers_unevenly(llama_dir, corpus):
    result = prune(
        recipe_for(
            llama_dir,
            corpus,
            ratio=0.4,
            allocation="global",
            criterion={"name": "flap", "options": {"structure": "AL-AM", "metric": "WIFN"}},
            reconstruction={"method": "none"},
        )
    )
    assert result.plan.ratio == pytest.approx(0.4, abs=0.02)


@pytest.mark.parametrize(
    ("criterion", "allocation", "message"),
    [
        ({"name": "flap", "options": {"metric": "XYZ"}}, "uniform", "unknown FLAP metric 'XYZ'"),
        ({"name": "flap", "options": {"structure": "AL-AM"}}, "uniform", "set allocation: global"),
        ({"name": "flap", "options": {"structure": "UL-UM"}}, "global", "set allocation: uniform"),
        ({"name": "flap", "options": {"structure": "XX"}}, "uniform", "unknown FLAP structure 'XX'"),
        ({"name": "flap", "options": {"alpha": 1}}, "uniform", "criterion 'flap' has no option"),
    ],
)
def test_bad_flap_options(criterion, allocation, message, llama_dir, corpus):
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(recipe_for(llama_dir, corpus, criterion=criterion, allocation=allocation))
