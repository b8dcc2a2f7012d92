"""Reconstruction-aware selection (structured OBS) against least-squares refits done by brute force."""

import numpy as np
import pytest
import torch

from core import prune
from core.stats.accumulate import InputStats
from core.stats.select import _unit_errors, damped_inverse_covariance, obs_select
from tests.conftest import fast_first, recipe_for


def _data(n=300, c_in=12, c_out=5, seed=0):
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(c_in, c_in))
    x = rng.normal(size=(n, c_in)) @ mix + rng.normal(size=c_in)  # correlated channels, non-zero mean
    return x, rng.normal(size=(c_out, c_in)), rng.normal(size=c_out)


def _stats(x):
    s = InputStats(x.shape[1], torch.float64)
    s.add_batch(torch.from_numpy(x))
    return s


def _refit_error(x, w, b, keep_channels):
    """Squared output error of the best affine refit from the kept channels (numpy lstsq)."""
    y = x @ w.T + b
    a = np.hstack([x[:, keep_channels], np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(((a @ coef - y) ** 2).sum())


def _channels(units, group):
    return [u * group + j for u in units for j in range(group)]


def _brute_greedy(x, w, b, n_units, group, n_keep, groups=None):
    kept = list(range(n_units))
    while len(kept) > n_keep:
        options = [u for u in kept if groups is None or sum(groups[v] == groups[u] for v in kept) > 1]
        cost = {u: _refit_error(x, w, b, _channels([v for v in kept if v != u], group)) for u in options}
        kept.remove(min(cost, key=cost.get))
    return kept


@pytest.mark.parametrize("group", [1, 3])
def test_unit_errors_equal_least_squares_refit_errors(group):
    """E({u}) = tr(W_u (H⁻¹_uu)⁻¹ W_uᵀ) is the squared output error left by refitting the rest."""
    x, w, b = _data()
    n_units = 12 // group
    hinv = damped_inverse_covariance(_stats(x), 0.0)
    got = _unit_errors(torch.from_numpy(w).T.contiguous(), hinv, torch.arange(n_units) * group, group)
    for u in range(n_units):
        expected = _refit_error(x, w, b, _channels([v for v in range(n_units) if v != u], group))
        assert float(got[u]) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(("group", "n_keep"), [(1, 5), (3, 2)])
def test_greedy_selection_equals_brute_force_greedy(group, n_keep):
    x, w, b = _data(seed=1)
    n_units = 12 // group
    got = obs_select(torch.from_numpy(w), _stats(x), n_keep, group, damp=0.0, rounds=12)
    assert got == _brute_greedy(x, w, b, n_units, group, n_keep)


def test_constrained_selection_keeps_a_unit_of_every_group_and_only_candidates():
    x, w, b = _data(seed=2)
    groups = [u // 2 for u in range(6)]  # 6 query heads of 2 channels over 3 key/value groups
    candidates = [0, 1, 2, 3, 5]  # head 4 is gone already (as its group's other head may not be)
    got = obs_select(torch.from_numpy(w), _stats(x), 3, 2, damp=0.0, candidates=candidates, groups_of=groups)
    assert len(got) == 3 and set(got) <= set(candidates)
    assert {groups[h] for h in got} == {0, 1, 2}
    # the same choice as brute force over the candidates, under the same constraint
    x_c = x[:, _channels(candidates, 2)]
    brute = _brute_greedy(x_c, w[:, _channels(candidates, 2)], b, 5, 2, 3, [groups[c] for c in candidates])
    assert got == [candidates[i] for i in brute]


def test_selection_lowers_the_refit_error_of_the_criterion_choice():
    """With the same count, the OBS choice leaves no more least-squares error than magnitude's."""
    x, w, b = _data(seed=3, c_in=24)
    magnitude = np.argsort(-(w**2).sum(0))[:12]
    obs = obs_select(torch.from_numpy(w), _stats(x), 12, 1, damp=0.0)
    assert _refit_error(x, w, b, obs) <= _refit_error(x, w, b, sorted(magnitude.tolist()))


@pytest.mark.parametrize("name", fast_first(1, ["llama", "gemma2", "opt"]))
def test_obs_selection_in_the_pipeline(name, request, corpus):
    """Same per-layer counts and parameter count as the criterion's plan, other units, lower error;
    streamed and in memory alike."""
    model_dir = request.getfixturevalue(f"{name}_dir")
    base = recipe_for(model_dir, corpus, ratio=0.4, reconstruction={"method": "ls", "damp": 1e-3}, device="cpu")
    # heads at the layer's ratio, as this test was written: a greedy choice is not guaranteed a lower
    # summed error in every configuration (with head_ratio auto the tiny OPT's is 10% higher)
    base["head_ratio"] = "same"
    plain = prune(base)
    obs = prune({**base, "reconstruction": {"method": "ls", "damp": 1e-3, "select": "obs"}})
    for a, b in zip(plain.plan.layers, obs.plan.layers):
        assert (len(a.heads), len(a.kv_heads), len(a.neurons)) == (len(b.heads), len(b.kv_heads), len(b.neurons))
    assert obs.params_after == plain.params_after
    assert sum(r.error_after for r in obs.report) < sum(r.error_after for r in plain.report)
    assert [list(map(int, lp.neurons)) for lp in obs.plan.layers] != [
        list(map(int, lp.neurons)) for lp in plain.plan.layers
    ]


def test_obs_selection_streamed_equals_in_memory(llama_dir, corpus, tmp_path):
    from tests.core.models.test_streaming import _assert_same_checkpoint, _both

    memory, memory_dir, streamed, stream_dir = _both(
        llama_dir, corpus, tmp_path, reconstruction={"method": "liar", "select": "obs"}
    )
    assert [list(map(int, lp.neurons)) for lp in streamed.plan.layers] == [
        list(map(int, lp.neurons)) for lp in memory.plan.layers
    ]
    _assert_same_checkpoint(memory_dir, stream_dir)


@pytest.mark.parametrize(("group", "step", "candidates"), [(1, 7, None), (4, 1, None), (4, 1, list(range(0, 50, 2)))])
def test_compacted_path_equals_the_uncompacted_one(group, step, candidates, monkeypatch):
    """Compacting the working matrices to the live channels changes no choice and no error: the same
    path as with every removed channel kept (zeroed) in the matrices, to the last unit."""
    from core.stats import select

    x, w, _ = _data(n=600, c_in=200, c_out=30, seed=4)
    n_cand = 200 // group if candidates is None else len(candidates)
    w_t, stats = torch.from_numpy(w), _stats(x)
    got = select.obs_curve(w_t, stats, n_cand - 1, group, 1e-3, candidates, step=step)
    monkeypatch.setattr(select, "COMPACT_BELOW", 0.0)  # never compact
    plain = select.obs_curve(w_t, stats, n_cand - 1, group, 1e-3, candidates, step=step)
    assert got.order == plain.order and got.removed == plain.removed
    np.testing.assert_allclose(got.error, plain.error, rtol=1e-9)


def test_a_released_path_frees_its_statistics_and_matches():
    from core.stats.select import obs_curve

    x, w, _ = _data(seed=5)
    kept, released = _stats(x), _stats(x)
    a = obs_curve(torch.from_numpy(w), kept, 11, 1, 1e-3)
    b = obs_curve(torch.from_numpy(w), released, 11, 1, 1e-3, release=True)
    assert kept.gram is not None and released.gram is None
    assert a == b


def test_released_inverse_equals_the_copied_one_also_when_the_factorisation_fails():
    """The inverse built in the statistics' own memory equals the one built on a copy; where the
    first factorisation fails (an indefinite matrix here) the retries run from the float32 copy."""
    x, _, _ = _data(seed=6)
    a, b = _stats(x), _stats(x)
    np.testing.assert_array_equal(damped_inverse_covariance(a, 1e-3), damped_inverse_covariance(b, 1e-3, release=True))
    assert b.gram is None and a.gram is not None

    def indefinite():
        s = _stats(x[:, :2])
        s.gram.copy_(torch.tensor([[1.0, 3.0], [3.0, 1.0]]) * len(x) + s.sum[:, None] * s.sum[None, :] / len(x))
        return s

    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        copied = damped_inverse_covariance(indefinite(), 1e-3)
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        released = damped_inverse_covariance(indefinite(), 1e-3, release=True)
    torch.testing.assert_close(released, copied, rtol=1e-6, atol=0)


@pytest.mark.parametrize("groups", ["free", "whole"])
def test_obs_selection_moves_the_key_value_heads_of_multi_head_attention(groups, tmp_path, corpus):
    """A LLaMA-family model with a key/value head per query head (LLaMA-7B's attention): the heads the
    selection keeps take their own key/value heads along, so the pruned model runs and reloads."""
    from core.models.loading import load_pruned
    from core.models.tiny import tiny_decoder

    model_dir = tiny_decoder(tmp_path / "mha", num_key_value_heads=8)
    base = recipe_for(model_dir, corpus, ratio=0.4, reconstruction={"method": "ls", "damp": 1e-3}, device="cpu")
    base.update(head_ratio="same", round_to={"kv_groups": groups})
    plain = prune(base)
    obs = prune({**base, "reconstruction": {"method": "ls", "damp": 1e-3, "select": "obs"}})
    assert [lp.heads for lp in obs.plan.layers] != [lp.heads for lp in plain.plan.layers]  # the selection moved
    for lp in obs.plan.layers:
        assert lp.kv_heads == sorted(lp.heads)
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    logits = obs.model(input_ids=ids).logits
    out = obs.save(tmp_path / "pruned")
    reloaded = load_pruned(out)[0]
    torch.testing.assert_close(reloaded(input_ids=ids).logits, logits)


def test_default_recipe_on_multi_head_attention_streams_as_in_memory(tmp_path, corpus):
    """Today's default (OBS counts, global allocation, OBS selection) on an MHA LLaMA: streamed and in
    memory give the same checkpoint. (On this tiny model the selection keeps the heads the OBS counts
    ranked, so the key/value bug above needs the explicit selection to show.)"""
    from core.models.tiny import tiny_decoder
    from tests.core.models.test_streaming import _assert_same_checkpoint, _both

    model_dir = tiny_decoder(tmp_path / "mha", num_key_value_heads=8)
    memory, memory_dir, streamed, stream_dir = _both(
        model_dir,
        corpus,
        tmp_path,
        ratio=0.4,
        criterion={"name": "auto"},
        reconstruction={"method": "ls", "damp": 1e-3, "select": "auto"},
    )
    assert memory.recipe.criterion.name == "obs" and memory.recipe.reconstruction.select == "obs"
    assert [lp.heads for lp in streamed.plan.layers] == [lp.heads for lp in memory.plan.layers]
    _assert_same_checkpoint(memory_dir, stream_dir)


def test_a_breakdown_inside_the_rounds_is_reported_once_at_the_end(monkeypatch):
    """The rounds never read the device (no singularity check per solve, on a GPU a synchronisation
    each); a path whose solves went non-finite is refused once it ends, with a sentence, not kept."""
    import core.stats.select as select

    x, w, _ = _data()
    real = torch.linalg.solve_ex
    calls = []

    def broken(a, b):
        calls.append(1)
        out = real(a, b)
        return type(out)((out.result * (float("nan") if len(calls) == 2 else 1.0), out.info))

    monkeypatch.setattr(select.torch.linalg, "solve_ex", broken)
    with pytest.raises(ValueError, match="broke down.*raise reconstruction.damp"):
        obs_select(torch.from_numpy(w), _stats(x), 6, 1, 1e-3, rounds=4)
    assert len(calls) >= 3  # the rounds after the breakdown ran on: nothing was read meanwhile
