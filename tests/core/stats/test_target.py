"""Error feedback (reconstruction.target: dense) against numpy least squares and whole-model forwards."""

import copy
from functools import partial

import numpy as np
import pytest
import torch

from core import prune
from core.data.calibration import decoder_windows, load_texts
from core.models.loading import load_model
from core.models.modeling_liar import ensure_bias, prune_layer_
from core.spec.recipe import Recipe
from core.stats.reconstruct import relative_output_error_from_inputs
from core.stats.target import TargetStats, refit_to_dense, relative_errors_to_dense
from tests.conftest import recipe_for
from tests.core.pipeline.test_pipeline import _capture, _logits


def _pair(n=400, c=10, c_out=4, seed=0):
    rng = np.random.default_rng(seed)
    x_d = rng.normal(size=(n, c)) @ rng.normal(size=(c, c)) + rng.normal(size=c)
    x_p = x_d + 0.3 * rng.normal(size=(n, c)) @ rng.normal(size=(c, c))  # drifted inputs
    return x_p, x_d, rng.normal(size=(c_out, c)), rng.normal(size=c_out)


def _stats(x_p, x_d, batches=3):
    s = TargetStats(x_p.shape[1], torch.float64)
    for a, b in zip(np.array_split(x_p, batches), np.array_split(x_d, batches)):
        s.add_pair(torch.from_numpy(a), torch.from_numpy(b))
    return s


def test_refit_to_dense_equals_numpy_least_squares():
    x_p, x_d, w, b = _pair()
    keep = torch.tensor([True, False, True, True, False, True, True, True, False, True])
    new_w, new_b = refit_to_dense(torch.from_numpy(w), torch.from_numpy(b), keep, _stats(x_p, x_d))
    a = np.hstack([x_p[:, keep.numpy()], np.ones((len(x_p), 1))])
    coef, *_ = np.linalg.lstsq(a, x_d @ w.T + b, rcond=None)
    np.testing.assert_allclose(new_w.numpy(), coef[:-1].T, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(new_b.numpy(), coef[-1], rtol=1e-8, atol=1e-8)


def test_errors_to_dense_from_statistics_and_from_inputs_equal_direct_computation():
    x_p, x_d, w, b = _pair(seed=1)
    keep = torch.tensor([True] * 6 + [False] * 4)
    stats = _stats(x_p, x_d)
    tw, tb = torch.from_numpy(w), torch.from_numpy(b)
    candidates = [(tw[:, keep], tb), refit_to_dense(tw, tb, keep, stats)]
    ref = x_d @ w.T + b
    expected = [
        ((ref - (x_p[:, keep.numpy()] @ cw.numpy().T + cb.numpy())) ** 2).sum() / (ref**2).sum()
        for cw, cb in candidates
    ]
    got = relative_errors_to_dense(tw, tb, keep, candidates, stats)
    direct = relative_output_error_from_inputs(
        tw, tb, keep, candidates, torch.from_numpy(x_p), x_ref=torch.from_numpy(x_d)
    )
    for e, g, d in zip(expected, got, direct):
        assert float(g) == pytest.approx(e, rel=1e-8) and float(d) == pytest.approx(e, rel=1e-10)
    assert float(got[1]) < float(got[0])


def _slow_error_feedback(recipe: Recipe, plan):
    """Each pruned projection refitted by numpy-free float64 lstsq of the pruned model's inputs onto the
    dense model's outputs, with whole-model forwards of both models."""
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    dense = copy.deepcopy(model)
    cfg = recipe.calibration
    fit, _ = decoder_windows(load_texts(cfg), tok, cfg)
    fam = adapter.family

    def refit(layer, dense_layer, path, keep, shrink):
        lin, dlin = layer.get_submodule(path), dense_layer.get_submodule(path)
        x_p = _capture(model, lin, fit, "decoder").double()
        x_d = _capture(dense, dlin, fit, "decoder").double()
        w = lin.weight.double()
        b = torch.zeros(w.shape[0], dtype=torch.float64) if lin.bias is None else lin.bias.double()
        a = torch.cat([x_p[:, keep], torch.ones(len(x_p), 1, dtype=torch.float64)], 1)
        coef = torch.linalg.lstsq(a, x_d @ w.T + b).solution
        shrink()
        lin = layer.get_submodule(path)
        ensure_bias(lin)
        lin.weight.copy_(coef[:-1].T)
        lin.bias.copy_(coef[-1])

    with torch.no_grad():
        for layer, dense_layer, lp in zip(adapter.layers(model), adapter.layers(dense), plan.layers):
            heads = torch.zeros(adapter.n_heads, dtype=torch.bool)
            heads[lp.heads] = True
            keep = heads.repeat_interleave(adapter.head_dim)
            n_all = adapter.n_neurons
            refit(
                layer,
                dense_layer,
                fam.o,
                keep,
                partial(prune_layer_, layer, fam, model.config, lp.heads, lp.kv_heads, n_all),
            )
            neurons = torch.zeros(n_all, dtype=torch.bool)
            neurons[lp.neurons] = True
            refit(
                layer,
                dense_layer,
                fam.ffn_out,
                neurons,
                partial(prune_layer_, layer, fam, model.config, lp.heads, lp.kv_heads, lp.neurons),
            )
    return model


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_error_feedback_pipeline_equals_whole_model_reference(name, request, corpus):
    recipe = Recipe.model_validate(
        recipe_for(
            request.getfixturevalue(f"{name}_dir"),
            corpus,
            ratio=0.4,
            reconstruction={"method": "ls", "damp": 0.0, "target": "dense"},
            calibration={"holdout_samples": 0},
            stats_dtype="float64",
        )
    )
    result = prune(recipe)
    ref = _slow_error_feedback(recipe, result.plan)
    with torch.no_grad():
        got, expected = _logits(result.model, result.tokenizer, "decoder"), _logits(ref, result.tokenizer, "decoder")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # and differs from the paper's target (the pruned model's own outputs)
    plain = prune(
        recipe.model_copy(update={"reconstruction": recipe.reconstruction.model_copy(update={"target": "pruned"})})
    )
    with torch.no_grad():
        assert (_logits(plain.model, plain.tokenizer, "decoder") - got).abs().max() > 1e-3


def test_error_feedback_streams_and_reports_errors_against_the_dense_outputs(llama_dir, corpus, tmp_path):
    from tests.core.models.test_streaming import _assert_same_checkpoint, _both

    memory, memory_dir, streamed, stream_dir = _both(
        llama_dir,
        corpus,
        tmp_path,
        reconstruction={"method": "ls", "target": "dense"},
        calibration={"num_calibration_samples": 40},  # 12 windows overfit a layer: held-aside error rises
    )
    _assert_same_checkpoint(memory_dir, stream_dir)
    assert all(r.error_after < r.error_before for r in memory.report)
    for a, b in zip(memory.report, streamed.report):
        assert b.error_after == pytest.approx(a.error_after, rel=1e-6)


def test_error_feedback_needs_an_exact_refit(llama_dir, corpus):
    with pytest.raises(ValueError, match="target 'dense'.*use method 'ls', not 'liar'"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, reconstruction={"method": "liar", "target": "dense"}))
