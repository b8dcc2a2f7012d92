"""The ``obs`` criterion: OBS error paths of the dense model as cross-layer scores, against references
on raw activations; the cap and its refusal (streamed equals in memory: tests/core/models/test_streaming.py)."""

import math

import numpy as np
import pytest
import torch

from core import prune
from core.criteria import REGISTRY, score_layer
from core.criteria.obs import marginal_scores
from core.data.calibration import decoder_windows, load_texts
from core.models.loading import load_model
from core.pipeline.scoring import score_layers, split_batches
from core.spec.criteria import parse_options
from core.spec.recipe import Recipe
from core.stats.accumulate import InputStats, OutputGain
from core.stats.select import Curve, obs_curve
from tests.conftest import recipe_for


def _fit_rows(model, adapter, fit):
    """Raw inputs of every layer's o_proj and down_proj and of the block itself, dense model."""
    fam, store, hooks = adapter.family, {}, []
    for i, layer in enumerate(adapter.layers(model)):
        for key, mod in (("attn", layer.get_submodule(fam.o)), ("ffn", layer.get_submodule(fam.ffn_out))):
            hooks.append(mod.register_forward_pre_hook(lambda _m, a, k=(i, key): store.setdefault(k, []).append(a[0])))

        def block(_m, args, kwargs, k=(i, "block")):
            store.setdefault(k, []).append(args[0] if args else kwargs["hidden_states"])

        hooks.append(layer.register_forward_pre_hook(block, with_kwargs=True))
    with torch.no_grad():
        for b in split_batches(fit, 5):
            model.base_model(input_ids=b.input_ids, attention_mask=b.attention_mask)
    for h in hooks:
        h.remove()
    return {k: torch.cat([x.reshape(-1, x.shape[-1]) for x in v]) for k, v in store.items()}


def _removal_error(x: np.ndarray, w: np.ndarray, removed: list[int], damp: float) -> float:
    """Summed squared output error of dropping channels ``removed`` of ``x @ w.T`` and refitting the rest
    by damped affine least squares (the ls refit), straight from the activations."""
    n, c = x.shape
    keep = [k for k in range(c) if k not in set(removed)]
    mu = x.mean(0)
    xc = x - mu
    cov = xc.T @ xc
    lam = damp * np.mean(np.diag(cov))
    a = cov[np.ix_(keep, keep)] + lam * np.eye(len(keep))
    target = xc @ w.T
    coef = np.linalg.solve(a, xc[:, keep].T @ target + lam * w[:, keep].T)  # min ‖X_c Δᵀ‖² + λ‖Δ‖²
    residual = target - xc[:, keep] @ coef
    # OBS's error is the damped objective's rise: ‖X_c Δᵀ‖² + λ‖Δ‖², Δ = new − old weights
    return float((residual**2).sum() + lam * ((coef - w[:, keep].T) ** 2).sum() + lam * (w[:, removed] ** 2).sum())


def test_marginal_scores_follow_the_path_and_never_decrease():
    curve = Curve(order=[3, 0, 4, 1], removed=[0, 2, 3, 4], error=[0.0, 2.0, 2.5, 7.0])
    s = marginal_scores(curve, 6, scale=0.5)
    assert s[3] == s[0] == pytest.approx(2.0)  # (2 − 0) / 2 units / 0.5
    assert s[4] == pytest.approx(2.0)  # 0.5 would be a drop: kept at the round before's
    assert s[1] == pytest.approx(9.0)  # (7 − 2.5) / 0.5
    assert math.isinf(s[2]) and math.isinf(s[5])  # never reached


def test_obs_scores_are_the_refit_errors_of_the_greedy_path_over_the_residual_energy(llama_dir, corpus):
    recipe = Recipe.model_validate(
        recipe_for(llama_dir, corpus, allocation="global", criterion={"name": "obs", "options": {"step": 1}})
    )
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    fit, _ = decoder_windows(load_texts(recipe.calibration), tok, recipe.calibration)
    scores = score_layers(model, adapter, recipe, split_batches(fit, 5), torch.device("cpu"))
    raw = _fit_rows(model, adapter, fit)
    fam = adapter.family
    for i, layer in enumerate(adapter.layers(model)):
        energy = float((raw[(i, "block")].double() ** 2).sum(1).mean())  # mean squared norm per token
        w = layer.get_submodule(fam.ffn_out).weight.detach()
        x = raw[(i, "ffn")]
        curve = obs_curve(w, InputStats.from_tensor(x, torch.float32), adapter.n_neurons - 1, 1, 1e-3, step=1)
        exact = obs_curve(w, InputStats.from_tensor(x.double()), adapter.n_neurons - 1, 1, 1e-3, step=1)
        xd, wd = x.double().numpy(), w.double().numpy()
        for k in (1, 2, len(exact.order) // 2, len(exact.order)):  # the path's errors, on the activations
            assert exact.error[k] == pytest.approx(_removal_error(xd, wd, exact.order[:k], 1e-3), rel=1e-6)
        torch.testing.assert_close(
            scores[i].neurons * energy, marginal_scores(curve, adapter.n_neurons), rtol=1e-5, atol=0
        )
        assert torch.isinf(scores[i].neurons).sum() == 1  # every neuron but the last one is on the path
        assert torch.isfinite(scores[i].heads).sum() == adapter.n_heads - 1


def test_output_gain_is_the_ratio_of_summed_squares_per_channel():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(3, 7, 5))
    z = y * rng.uniform(0.5, 4.0, size=5) / np.sqrt((y**2).mean(-1, keepdims=True))  # an RMSNorm's output
    mask = rng.random((3, 7)) > 0.3
    gain = OutputGain(5)
    gain.add_batch(torch.tensor(y[:2]), torch.tensor(z[:2]), torch.tensor(mask[:2]))
    gain.add_batch(torch.tensor(y[2:]), torch.tensor(z[2:]), torch.tensor(mask[2:]))
    ref = (z[mask] ** 2).sum(0) / (y[mask] ** 2).sum(0)
    np.testing.assert_allclose(gain.squared.numpy(), ref, rtol=1e-12)
    silent = OutputGain(2)
    silent.add_batch(torch.zeros(4, 2), torch.zeros(4, 2))
    assert silent.squared.tolist() == [1.0, 1.0]  # a channel that never moved: unobserved, left at 1


def test_obs_reads_errors_through_the_sandwich_norms_into_residual_units(gemma3_dir, corpus):
    """Gemma's o_proj and down_proj outputs pass a norm before the residual: each output row's errors
    count with the squared gain that norm applies to it, measured on the raw activations here."""
    recipe = Recipe.model_validate(
        recipe_for(gemma3_dir, corpus, allocation="global", criterion={"name": "obs", "options": {"step": 1}})
    )
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    fam = adapter.family
    fit, _ = decoder_windows(load_texts(recipe.calibration), tok, recipe.calibration)
    scores = score_layers(model, adapter, recipe, split_batches(fit, 5), torch.device("cpu"))
    raw, norms, hooks = _fit_rows(model, adapter, fit), {}, []
    for i, layer in enumerate(adapter.layers(model)):
        for key, path in (("attn", fam.attn_output_norm), ("ffn", fam.ffn_output_norm)):
            hook = lambda _m, a, z, k=(i, key): norms.setdefault(k, []).append((a[0].flatten(0, 1), z.flatten(0, 1)))
            hooks.append(layer.get_submodule(path).register_forward_hook(hook))
    with torch.no_grad():
        for b in split_batches(fit, 5):
            model.base_model(input_ids=b.input_ids, attention_mask=b.attention_mask)
    for h in hooks:
        h.remove()
    for i, layer in enumerate(adapter.layers(model)):
        energy = float((raw[(i, "block")].double() ** 2).sum(1).mean())
        for key, path, n, width in (
            ("attn", fam.o, adapter.n_heads, adapter.head_dim),
            ("ffn", fam.ffn_out, adapter.n_neurons, 1),
        ):
            y = torch.cat([p[0] for p in norms[(i, key)]]).double()
            z = torch.cat([p[1] for p in norms[(i, key)]]).double()
            gain = (z**2).sum(0) / (y**2).sum(0)
            assert gain.max() / gain.min() > 1.5  # the rows weigh differently: the test sees the gain
            w = layer.get_submodule(path).weight.detach().double() * gain.sqrt()[:, None]
            curve = obs_curve(w, InputStats.from_tensor(raw[(i, key)].double()), n - 1, width, 1e-3, step=1)
            got = scores[i].heads if key == "attn" else scores[i].neurons
            torch.testing.assert_close(got * energy, marginal_scores(curve, n), rtol=1e-4, atol=0)


def _capped(model_dir, corpus, ratio: float, cap: float, over_cap: str = "never") -> dict:
    options = {"max_layer_ratio": cap, "over_cap": over_cap}
    return recipe_for(
        model_dir, corpus, ratio=ratio, allocation="global", criterion={"name": "obs", "options": options}
    )


def test_obs_cap_limits_every_layer_and_refuses_an_unreachable_ratio(llama_dir, corpus):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    capped = prune(_capped(llama_dir, corpus, 0.3, 0.5))
    assert capped.plan.ratio == pytest.approx(0.3, abs=0.03)  # streamed equal to in memory: test_streaming.py
    for lp in capped.plan.layers:
        assert adapter.n_heads - len(lp.heads) <= adapter.n_heads // 2
        assert adapter.n_neurons - len(lp.neurons) <= adapter.n_neurons // 2
    with pytest.raises(ValueError, match="max_layer_ratio"):
        prune(_capped(llama_dir, corpus, 0.6, 0.2))


@pytest.mark.slow
def test_a_soft_cap_changes_nothing_where_the_ratio_is_reachable_and_reaches_it_where_not(llama_dir, corpus):
    """``over_cap: last`` (the default's cap): the same plan as the hard cap when the units within the
    caps reach the ratio; otherwise the ratio is reached, every layer first losing all it may within
    its cap."""
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    kept = lambda result: [(len(lp.heads), len(lp.neurons)) for lp in result.plan.layers]  # noqa: E731
    hard = prune(_capped(llama_dir, corpus, 0.3, 0.5))
    assert kept(prune(_capped(llama_dir, corpus, 0.3, 0.5, "last"))) == kept(hard)
    soft = prune(_capped(llama_dir, corpus, 0.6, 0.2, "last"))  # the hard cap refuses this one (above)
    assert soft.plan.ratio == pytest.approx(0.6, abs=0.03)
    within = math.floor(0.2 * adapter.n_neurons)
    assert all(adapter.n_neurons - len(lp.neurons) >= within for lp in soft.plan.layers)
    assert any(adapter.n_neurons - len(lp.neurons) > within for lp in soft.plan.layers)


def test_obs_options_and_recipe_fit_are_checked():
    assert REGISTRY["obs"].second_order and REGISTRY["obs"].needs == "inputs"
    for bad, msg in (
        ({"max_layer_ratio": 1.5}, "fraction in \\(0, 1\\]"),
        ({"max_layer_ratio": True}, "fraction"),
        ({"normalize": "layer"}, "obs normalize"),
        ({"step": 0}, "positive integer"),
        ({"step": "fine"}, "'auto' or a positive integer"),
        ({"over_cap": "sometimes"}, "obs over_cap"),
        ({"cap": 0.5}, "no option"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_options("obs", bad)
    with pytest.raises(ValueError, match="set allocation: global"):
        parse_options("obs", {}, "both", "uniform")
    with pytest.raises(ValueError, match="calibration data"):  # it needs its inputs' statistics
        score_layer("obs", torch.nn.Linear(2, 2), None, 0, {}, None)


@pytest.mark.parametrize("execution", ["memory", "stream"])
def test_scoring_block_by_block_reports_each_block(llama_dir, corpus, tmp_path, execution):
    """A criterion that scores one block at a time (the default's obs counts: a dense pass of its own)
    reports each block, so a job shows the stage moving and can be cancelled between blocks."""
    seen = []
    recipe = recipe_for(llama_dir, corpus, allocation="global", criterion={"name": "obs"}, execution=execution)
    out = tmp_path / "out" if execution == "stream" else None
    result = prune(
        recipe, progress=lambda stage, i, n: seen.append((i, n)) if stage == "scoring" else None, output_dir=out
    )
    n = len(result.plan.layers)  # the stage's opening (0, n) and closing (n, n) besides one per block
    assert n > 1 and seen == [(0, n)] + [(i, n) for i in range(1, n + 1)] + [(n, n)]


def test_auto_step_keeps_32_up_to_2048_neurons_and_at_most_64_rounds():
    from core.criteria.obs import path_step

    assert parse_options("obs", {}).step == "auto"
    # every model the default was measured on keeps its step, so its results stand
    assert path_step("auto", 1536) == path_step("auto", 2048) == 32  # SmolLM2, Gemma 3 270M
    assert path_step("auto", 48) == 32
    for n in (2049, 5632, 11008, 28672):  # wider: at most 64 rounds, never fewer than 32 a round
        step = path_step("auto", n)
        assert math.ceil(n / step) <= 64 and math.ceil(n / (step - 1)) > 64
    assert path_step(7, 11008) == 7
