"""``head_ratio: obs``: each layer's split between heads and neurons from OBS error curves."""

import pytest
import torch
from pydantic import ValidationError

from core import prune
from core.allocation.split import best_split
from core.spec.recipe import Recipe
from core.stats.select import Curve, obs_curve, obs_select
from tests.conftest import fast_first, recipe_for
from tests.core.stats.test_select import _brute_greedy, _channels, _data, _refit_error, _stats


@pytest.mark.parametrize(("group", "step", "n_remove"), [(1, 1, 8), (1, 3, 10), (3, 1, 3)])
def test_curve_errors_equal_least_squares_refit_errors(group, step, n_remove):
    """After each round the curve's error is the squared output error of the best affine refit from
    the units still kept (numpy lstsq on the raw inputs), whatever number went in one round."""
    x, w, b = _data()
    n_units = 12 // group
    curve = obs_curve(torch.from_numpy(w), _stats(x), n_remove, group, damp=0.0, step=step)
    assert curve.removed == sorted({0, *range(step, n_remove, step), n_remove})
    assert len(curve.order) == len(set(curve.order)) == n_remove
    for gone, error in zip(curve.removed, curve.error):
        kept = curve.kept(n_units, gone)
        assert len(kept) == n_units - gone and not set(kept) & set(curve.order[:gone])
        assert error == pytest.approx(
            _refit_error(x, w, b, _channels(kept, group)) - _refit_error(x, w, b, list(range(12))), rel=1e-4, abs=1e-6
        )


def test_curve_path_is_the_greedy_selection():
    """One unit per round, the path's first k units are what a brute-force greedy removes, and what
    obs_select keeps with the same constraint."""
    x, w, b = _data(seed=1)
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    curve = obs_curve(torch.from_numpy(w), _stats(x), 8, 1, damp=0.0, groups_of=groups)
    for n_keep in (11, 8, 4):
        brute = _brute_greedy(x, w, b, 12, 1, n_keep, groups)
        assert curve.kept(12, 12 - n_keep) == sorted(brute)
        assert obs_select(torch.from_numpy(w), _stats(x), n_keep, 1, 0.0, groups_of=groups) == sorted(brute)
    with pytest.raises(ValueError, match="every group is down to one"):
        obs_curve(torch.from_numpy(w), _stats(x), 9, 1, damp=0.0, groups_of=groups)


def test_curve_interpolates_between_rounds():
    curve = Curve(order=list(range(8)), removed=[0, 4, 8], error=[0.0, 2.0, 10.0])
    assert (curve.at(0), curve.at(2), curve.at(4), curve.at(6), curve.at(8)) == (0.0, 1.0, 2.0, 6.0, 10.0)
    with pytest.raises(ValueError, match="covers 0 to 8"):
        curve.at(9)


def _split_reference(head_err, neuron_err, unit, neuron, share, n_neurons):
    """Every head count the share pays for, with exactly the neurons that make up the rest."""
    options = []
    for k, e in enumerate(head_err):
        if k * unit > share:
            break
        n = round((share - k * unit) / neuron)
        if n <= n_neurons - 1:
            options.append((e + neuron_err(n), k, n))
    return min(options)


@pytest.mark.parametrize("share", [300, 250, 120])
def test_best_split_is_the_least_summed_error(share):
    """Heads of 100 parameters with rising errors, neurons of 10 whose error grows as n²/50; exact
    widths: the split with the least summed error, by hand for share 300 (k = 2: 5 + 2 against
    k = 0: 18, k = 1: 1 + 8, k = 3: 30)."""
    head_err = [0.0, 1.0, 5.0, 30.0]
    heads = Curve(order=[3, 1, 0], removed=[0, 1, 2, 3], error=head_err)
    neurons = Curve(order=list(range(39)), removed=list(range(40)), error=[n * n / 50 for n in range(40)])
    got = best_split(heads, neurons, 100, 10, 40, 1, share)
    err, k, n = _split_reference(head_err, lambda n: n * n / 50, 100, 10, share, 40)
    assert (got.heads_removed, got.neurons_removed, got.error) == (k, n, pytest.approx(err))
    assert got.removed == k * 100 + n * 10
    if share == 300:
        assert (k, n, err) == (2, 10, 7.0)


def test_best_split_keeps_the_share_when_neurons_run_out():
    """When the FFN's path cannot make up the share, more heads go even though they cost more error;
    kept widths stay multiples of the given one."""
    heads = Curve(order=[0, 1, 2], removed=[0, 1, 2, 3], error=[0.0, 10.0, 20.0, 30.0])
    neurons = Curve(order=list(range(16)), removed=[0, 8, 16], error=[0.0, 0.1, 0.2])
    got = best_split(heads, neurons, 100, 10, 24, 8, share=260)  # 16 neurons = 160: one head at least
    assert (got.heads_removed, got.neurons_removed, got.removed) == (1, 16, 260)


def test_recipe_needs_obs_selection(llama_dir, corpus):
    ok = recipe_for(llama_dir, corpus, head_ratio="obs", reconstruction={"method": "ls", "select": "auto"})
    assert Recipe.model_validate(ok).head_ratio == "obs"
    for rec in ({"method": "ls", "select": "criterion"}, {"method": "bias", "select": "auto"}):
        with pytest.raises(ValidationError, match="head_ratio 'obs' chooses each layer's split"):
            Recipe.model_validate(recipe_for(llama_dir, corpus, head_ratio="obs", reconstruction=rec))


def _obs_recipe(model_dir, corpus, **kw):
    rec = {"method": "ls", "select": "obs", "damp": 1e-3}
    kw = {"round_to": {"neurons": 1}} | kw
    return recipe_for(model_dir, corpus, head_ratio="obs", reconstruction=rec, **kw)


def test_silent_heads_go_first(llama_mha_dir, corpus, tmp_path):
    """Heads whose o_proj columns are zero add nothing to the output: removing them costs no error, so
    a layer whose share pays for them drops all of them, and the neurons make up the rest."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_mha_dir)
    silent = [1, 4, 6]
    for layer in model.model.layers:
        for h in silent:
            layer.self_attn.o_proj.weight.data[:, h * 8 : (h + 1) * 8] = 0.0
    model.save_pretrained(tmp_path / "m")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(llama_mha_dir).save_pretrained(tmp_path / "m")
    result = prune(_obs_recipe(tmp_path / "m", corpus, ratio=0.5))
    for lp in result.plan.layers:
        assert not set(silent) & set(lp.heads)
        assert lp.kv_heads == lp.heads  # multi-head attention: each head its own key/value head
    assert abs(result.achieved_ratio - 0.5) < 0.02


@pytest.mark.parametrize("kv", ["free", "whole"])
def test_obs_split_end_to_end(llama_dir, corpus, kv):
    """The tiny LLaMA (8 query heads over 4 key/value heads): the ratio is met, key/value groups keep
    a query head each (free) or go whole, the summary reports the split the layers chose, and the
    model runs."""
    result = prune(_obs_recipe(llama_dir, corpus, ratio=0.4, round_to={"neurons": 1, "kv_groups": kv}))
    assert abs(result.achieved_ratio - 0.4) < 0.02
    for li, lp in enumerate(result.plan.layers):
        groups = {h // 2 for h in lp.heads}
        assert sorted(groups) == lp.kv_heads
        if kv == "free":
            assert lp.kv_heads == [0, 1, 2, 3]
        else:
            assert lp.heads == [g * 2 + r for g in lp.kv_heads for r in range(2)]
        q = result.adapter.layers(result.model)[li].self_attn.q_proj
        assert q.weight.shape[0] == len(lp.heads) * 8
    mean = sum(len(lp.heads) for lp in result.plan.layers) / len(result.plan.layers)
    assert result.summary()["kept_heads_mean"] == pytest.approx(mean)
    assert torch.isfinite(result.model(torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.slow
def test_obs_split_streamed_equals_in_memory(llama_dir, corpus, tmp_path):
    """A streamed run chooses the same splits and writes the same checkpoint as one in memory."""
    from tests.core.models.test_streaming import _assert_same_checkpoint, _both

    rec = {"method": "ls", "select": "obs", "damp": 1e-3}
    memory, memory_dir, streamed, stream_dir = _both(
        llama_dir, corpus, tmp_path, ratio=0.4, head_ratio="obs", reconstruction=rec
    )
    assert [lp.heads for lp in memory.plan.layers] == [lp.heads for lp in streamed.plan.layers]
    assert [len(lp.neurons) for lp in memory.plan.layers] == [len(lp.neurons) for lp in streamed.plan.layers]
    _assert_same_checkpoint(memory_dir, stream_dir)


@pytest.mark.parametrize(("attn_scale", "ffn_scale"), fast_first(1, [(30.0, 0.03), (0.03, 30.0)]))
def test_obs_split_weighs_errors_by_the_sandwich_norms_gains(gemma3_dir, corpus, tmp_path, attn_scale, ffn_scale):
    """Gemma's attention and FFN outputs pass their own norms before the residual stream: the split
    compares the two paths' errors in residual units. With the attention's norm scaled up and the
    FFN's down, every layer keeps all its heads; the other way round, every layer sheds heads (the
    errors before the norms are the same in both models: scaling a norm changes only what follows)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gemma3_dir)
    for layer in model.model.layers:  # Gemma's RMSNorm scales by (1 + weight)
        layer.mlp.gate_proj.weight.data *= 30  # tiny random weights leave the FFN nearly linear,
        layer.mlp.up_proj.weight.data *= 30  # and any neuron's loss refittable from the rest
        layer.post_attention_layernorm.weight.data.fill_(attn_scale - 1)
        layer.post_feedforward_layernorm.weight.data.fill_(ffn_scale - 1)
    model.save_pretrained(tmp_path / "m")
    AutoTokenizer.from_pretrained(gemma3_dir).save_pretrained(tmp_path / "m")
    result = prune(_obs_recipe(tmp_path / "m", corpus, ratio=0.3))
    n_heads = result.adapter.n_heads
    kept = [len(lp.heads) for lp in result.plan.layers]
    assert all(k == n_heads for k in kept) if attn_scale > 1 else all(k < n_heads for k in kept), kept
    assert abs(result.achieved_ratio - 0.3) < 0.02
