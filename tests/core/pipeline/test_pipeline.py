"""The streaming, sequential pipeline against a slow two-pass reference built from raw activations."""

from functools import partial

import pytest
import torch

from core import prune
from core.allocation import Budget, allocate
from core.criteria import score_layer
from core.data.calibration import decoder_windows, encoder_samples, load_texts
from core.models.adapter import block_parameters, unit_costs
from core.models.liar_families import pools_first_token
from core.models.loading import load_model
from core.models.modeling_liar import ensure_bias, prune_layer_
from core.spec.recipe import Recipe
from core.stats.reconstruct import METHODS, reconstruct_linear
from tests.conftest import fast_first, recipe_for


def _capture(model, module, batch, kind, positions="all"):
    """Raw inputs of ``module`` for the whole calibration batch, padding removed, in one forward pass
    (with ``positions="first"``: only each sequence's first token; ``"pooled"`` is resolved per layer
    by the caller)."""
    store = []

    def hook(_m, args):
        store.append(args[0].detach())
        raise StopIteration

    h = module.register_forward_pre_hook(hook)
    try:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    except StopIteration:
        pass
    finally:
        h.remove()
    x = store[0]
    if positions == "first":
        return x[:, 0]
    return x[batch.attention_mask.bool()] if kind == "encoder" else x.reshape(-1, x.shape[-1])


def slow_reference(recipe: Recipe, plan=None):
    """Algorithm 1 written plainly: whole-model forwards, activations kept in memory, float64 lstsq maths.
    ``plan``: the kept heads and neurons per layer (default: the recipe's allocation without rounding)."""
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    # criterion / allocation auto made concrete, as the pipeline does
    recipe = recipe.resolved(adapter.kind, pools_first_token([type(model).__name__]))
    cfg = recipe.calibration
    fit, _ = (decoder_windows if adapter.kind == "decoder" else encoder_samples)(load_texts(cfg), tok, cfg)
    layers = adapter.layers(model)
    scores = [
        score_layer(recipe.criterion.name, ly, adapter, i, recipe.criterion.options) for i, ly in enumerate(layers)
    ]
    plan = plan or allocate(
        scores,
        adapter,
        [unit_costs(ly, adapter) for ly in layers],
        [sum(p.numel() for p in ly.parameters()) for ly in layers],
        Budget(ratio=recipe.ratio, modules=recipe.modules, allocation=recipe.allocation, head_ratio=recipe.head_ratio),
    )
    fam, method, damp = adapter.family, recipe.reconstruction.method, recipe.reconstruction.damp

    def step(layer, path, keep, group, shrink):
        lin = layer.get_submodule(path)
        positions = recipe.reconstruction.positions
        if positions == "pooled":  # the last block fits the first token only, the others every token
            positions = "first" if layer is layers[-1] else "all"
        x = _capture(model, lin, fit, adapter.kind, positions).double()
        b = None if lin.bias is None else lin.bias.double()
        nw, nb = reconstruct_linear(method, x, lin.weight.double(), b, keep, damp, group_size=group)
        shrink()
        lin = layer.get_submodule(path)
        with torch.no_grad():
            lin.weight.copy_(nw)
            if lin.bias is not None or method in ("bias", "liar", "ls"):
                ensure_bias(lin)
                lin.bias.copy_(nb)

    with torch.no_grad():
        for layer, lp in zip(layers, plan.layers):
            heads = torch.zeros(adapter.n_heads, dtype=torch.bool)
            heads[lp.heads] = True
            n_all = adapter.n_neurons
            step(
                layer,
                fam.o,
                heads.repeat_interleave(adapter.head_dim),
                adapter.head_dim,
                partial(prune_layer_, layer, fam, model.config, lp.heads, lp.kv_heads, n_all),
            )
            neurons = torch.zeros(adapter.n_neurons, dtype=torch.bool)
            neurons[lp.neurons] = True
            step(
                layer,
                fam.ffn_out,
                neurons,
                1,
                partial(prune_layer_, layer, fam, model.config, lp.heads, lp.kv_heads, lp.neurons),
            )
    return model, plan


def _logits(model, tok, kind):
    """A decoder's logits; an encoder's last hidden states at every position (the tiny classifier's
    pooler saturates: its logits hardly depend on the text, so they would hide differences)."""
    texts = ["the model keeps a head and a neuron.", "least square error of the pruned layer output."]
    enc = tok(texts, padding=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    return model(**inputs).logits if kind == "decoder" else model.base_model(**inputs).last_hidden_state


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("name", fast_first(2, ["llama", "bert", "qwen2"]))
def test_pipeline_equals_slow_reference(name, method, model_dirs, corpus):
    # the encoder is compared on its hidden states, where float32 rounding of the Gram shows through
    # ls (2.6e-4); float64 statistics compare the positions and the maths, not the rounding
    precision = {"stats_dtype": "float64"} if name == "bert" else {}
    recipe = Recipe.model_validate(
        recipe_for(
            model_dirs[name],
            corpus,
            reconstruction={"method": method, "damp": 1e-3},
            calibration={"holdout_samples": 0},
            **precision,
        )
    )
    result = prune(recipe)
    ref, plan = slow_reference(recipe)
    assert [lp.heads for lp in plan.layers] == [lp.heads for lp in result.plan.layers]
    kind = result.adapter.kind
    with torch.no_grad():
        got, expected = _logits(result.model, result.tokenizer, kind), _logits(ref, result.tokenizer, kind)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", fast_first(2, ["bias", "liar", "ls", "mask_tuning"]))
def test_first_position_reconstruction_equals_slow_reference(method, model_dirs, corpus):
    """``positions: first`` fits the [CLS] token of every calibration text and nothing else."""
    recipe = Recipe.model_validate(
        recipe_for(
            model_dirs["bert"],
            corpus,
            reconstruction={"method": method, "damp": 1e-2, "positions": "first"},
            calibration={"holdout_samples": 0},
            stats_dtype="float64",  # few fitting rows: compare positions, not float32 rounding
        )
    )
    result = prune(recipe)
    ref, _ = slow_reference(recipe)
    with torch.no_grad():
        got, expected = _logits(result.model, result.tokenizer, "encoder"), _logits(ref, result.tokenizer, "encoder")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # the first block's FFN output projection equals the reference and differs from an all-token fit
    all_tokens = recipe.reconstruction.model_copy(update={"positions": "all"})
    everywhere = prune(recipe.model_copy(update={"reconstruction": all_tokens}))
    path = result.adapter.family.ffn_out

    def params(model):
        lin = result.adapter.layers(model)[0].get_submodule(path)
        return torch.cat([lin.weight.detach().flatten(), lin.bias.detach().flatten()]).float()

    torch.testing.assert_close(params(result.model), params(ref), rtol=1e-4, atol=1e-5)
    assert (params(result.model) - params(everywhere.model)).abs().max() > 1e-3


def test_pooled_positions_fit_only_the_last_block_on_cls(model_dirs, corpus):
    """``positions: pooled`` changes the last block's fit and nothing below it: the first block's
    weights are those of an all-token fit (the last block's equal the slow reference's: below)."""
    base = recipe_for(model_dirs["bert"], corpus, calibration={"holdout_samples": 0}, stats_dtype="float64")
    runs = {
        p: prune(base | {"reconstruction": {"method": "ls", "damp": 1e-2, "select": "criterion", "positions": p}})
        for p in ("pooled", "all")
    }
    path = runs["pooled"].adapter.family.ffn_out

    def weight(p, block):
        return runs[p].adapter.layers(runs[p].model)[block].get_submodule(path).weight.detach()

    torch.testing.assert_close(weight("pooled", 0), weight("all", 0), rtol=0, atol=0)
    assert (weight("pooled", -1) - weight("all", -1)).abs().max() > 1e-3
    ref, _ = slow_reference(runs["pooled"].recipe)
    tok = runs["pooled"].tokenizer
    with torch.no_grad():
        got, expected = _logits(runs["pooled"].model, tok, "encoder"), _logits(ref, tok, "encoder")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_first_position_is_refused_for_decoders(llama_dir, corpus):
    recipe = recipe_for(llama_dir, corpus, reconstruction={"method": "liar", "positions": "first"})
    with pytest.raises(ValueError, match="first.*decoder"):
        prune(recipe)
    with pytest.raises(ValueError, match="pooled.*decoder"):
        prune(recipe | {"reconstruction": {"method": "liar", "positions": "pooled"}})
    with pytest.raises(ValueError, match="positions"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, reconstruction={"method": "liar", "positions": "cls"}))


@pytest.mark.parametrize("name", fast_first(1, ["llama", "qwen2", "bert"]))
def test_reconstruction_reduces_held_out_error(name, model_dirs, corpus):
    """On held-aside tokens, LIAR and LS cut the pruned projections' output error."""
    errors = {}
    for method in ("none", "liar", "ls"):
        result = prune(
            recipe_for(
                model_dirs[name],
                corpus,
                ratio=0.4,
                reconstruction={"method": method, "damp": 1e-3},
                calibration={"num_calibration_samples": 24, "holdout_samples": 6},
            )
        )
        errors[method] = sum(r.error_after for r in result.report)
        assert all(r.measured_on == "held-aside" for r in result.report)
        if method == "none":  # 'none' does nothing beyond pruning
            assert errors["none"] == pytest.approx(sum(r.error_before for r in result.report), rel=1e-9)
    assert errors["ls"] < errors["none"] and errors["liar"] < errors["none"], errors


@pytest.mark.parametrize("name", fast_first(1, ["llama", "qwen2", "bert"]))
@pytest.mark.parametrize("allocation", ["uniform", "global"])
@pytest.mark.parametrize("modules", ["both", "heads", "neurons"])
def test_parameter_count_matches_target(name, allocation, modules, model_dirs, corpus):
    ratio = 0.15 if modules == "heads" else 0.35
    result = prune(
        recipe_for(
            model_dirs[name],
            corpus,
            ratio=ratio,
            modules=modules,
            allocation=allocation,
            reconstruction={"method": "none"},
        )
    )
    model, adapter = result.model, result.adapter
    # 'none' adds no bias: the removed parameters are exactly what the plan promised
    removed = result.block_params_before - block_parameters(model, adapter)
    assert removed == result.plan.removed
    layer = adapter.layers(model)[0]
    costs = unit_costs(layer, adapter)
    # documented rounding: uniform is within half a unit per layer (a head for heads-only, a neuron
    # otherwise); global is within half of the largest unit overall
    head = costs["head"] + costs["kv"]
    if allocation == "uniform":
        tolerance = ((head if modules == "heads" else costs["neuron"]) / 2 + 1) * adapter.n_layers
    else:
        tolerance = max(head, costs["neuron"]) / 2 + 1
    assert abs(removed - ratio * result.block_params_before) <= tolerance
    assert result.achieved_ratio == pytest.approx(removed / result.block_params_before)


def test_progress_callback_reports_every_layer(llama_dir, corpus):
    events = []
    prune(recipe_for(llama_dir, corpus), progress=lambda stage, i, n: events.append((stage, i, n)))
    stages = [e[0] for e in events]
    assert stages[0] == "load" and stages[-1] == "done"
    assert [e for e in events if e[0] == "reconstruct"] == [("reconstruct", i, 2) for i in range(3)]


def test_progress_callback_can_cancel(llama_dir, corpus):
    class Cancelled(Exception):
        pass

    def cancel(stage, i, n):
        if stage == "reconstruct" and i == 1:
            raise Cancelled

    with pytest.raises(Cancelled):
        prune(recipe_for(llama_dir, corpus), progress=cancel)


def test_global_allocation_can_differ_across_layers(llama_dir, corpus):
    result = prune(recipe_for(llama_dir, corpus, ratio=0.4, allocation="global", reconstruction={"method": "none"}))
    widths = {(len(lp.heads), len(lp.neurons)) for lp in result.plan.layers}
    assert result.plan.ratio == pytest.approx(0.4, abs=0.01)
    assert all(1 <= h and 1 <= n for h, n in widths)


def test_pruned_model_is_smaller_and_every_query_head_keeps_its_kv_head(llama_dir, corpus):
    result = prune(recipe_for(llama_dir, corpus, ratio=0.5))
    assert result.params_after < result.params_before
    fam = result.adapter.family
    for layer, lp in zip(result.adapter.layers(result.model), result.plan.layers):
        attn = layer.get_submodule(fam.attn)
        assert attn.liar_heads == lp.heads
        assert {h // result.adapter.n_rep for h in lp.heads} == set(lp.kv_heads)
        assert layer.get_submodule(fam.k).out_features == len(lp.kv_heads) * result.adapter.head_dim


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_model_reconstructs_with_fp32_statistics(dtype, llama_dir, corpus):
    result = prune(recipe_for(llama_dir, corpus, dtype=dtype, reconstruction={"method": "ls", "damp": 1e-3}))
    assert {p.dtype for p in result.model.parameters()} == {getattr(torch, dtype)}
    assert sum(r.error_after for r in result.report) < sum(r.error_before for r in result.report)
    ids = torch.randint(5, 40, (1, 10))
    assert torch.isfinite(result.model(input_ids=ids).logits).all()


def test_pretokenised_calibration_override(llama_dir, corpus):
    from core.data.calibration import CalibrationBatch

    model, tok, _ = load_model(str(llama_dir), "float32", "cpu")
    ids = torch.randint(5, 40, (6, 16), generator=torch.Generator().manual_seed(0))
    fit, held = CalibrationBatch(ids[:4], torch.ones_like(ids[:4])), CalibrationBatch(ids[4:], torch.ones_like(ids[4:]))
    result = prune(recipe_for(llama_dir, corpus), model=model, calibration=(fit, held))
    assert result.model is model and result.achieved_ratio > 0.25


@pytest.mark.parametrize("method", ["none", "bias", "liar", "ls"])
def test_report_equals_raw_error_on_held_aside_tokens(method, llama_dir, corpus):
    """Layer 0's reported errors equal ‖XW+B − (X_uW'+B')‖²/‖XW+B‖² computed on raw held-aside activations."""
    recipe = Recipe.model_validate(recipe_for(llama_dir, corpus, reconstruction={"method": method, "damp": 1e-3}))
    result = prune(recipe)
    dense, tok, adapter = load_model(recipe.model, "float32", "cpu")
    _, held = decoder_windows(load_texts(recipe.calibration), tok, recipe.calibration)
    lin = adapter.layers(dense)[0].get_submodule(adapter.family.o)
    x = _capture(dense, lin, held, "decoder").double()
    w = lin.weight.double()
    full = x @ w.T
    lp = result.plan.layers[0]
    keep = torch.zeros(adapter.n_heads, dtype=torch.bool)
    keep[lp.heads] = True
    keep = keep.repeat_interleave(adapter.head_dim)
    pruned = adapter.layers(result.model)[0].get_submodule(adapter.family.o)
    approx = x[:, keep] @ pruned.weight.double().T
    if pruned.bias is not None:
        approx = approx + pruned.bias.double()
    naive = x[:, keep] @ w[:, keep].T
    row = next(r for r in result.report if r.layer == 0 and r.module == "attention")
    den = (full**2).sum()
    assert row.error_after == pytest.approx(float(((full - approx) ** 2).sum() / den), rel=1e-4)
    assert row.error_before == pytest.approx(float(((full - naive) ** 2).sum() / den), rel=1e-4)


@pytest.mark.parametrize(
    ("n_neurons", "device", "expected"),
    [(11008, "cuda", 128), (1536, "cpu", 64), (1536, "cuda", 64), (688, "cpu", 32), (256, "cpu", 16), (48, "cpu", 1)],
)
def test_auto_ffn_multiple_suits_device_and_width(n_neurons, device, expected):
    from core.allocation.plan import auto_multiple

    assert auto_multiple(n_neurons, device) == expected


def test_default_rounding_is_auto_and_reported(tmp_path, corpus):
    """round_to.neurons defaults to 'auto': on this CPU a 256-wide FFN is kept in multiples of 16; the
    resolved multiples are in the summary; 1 keeps exact widths."""
    from core.models.tiny import tiny_decoder

    model_dir = tiny_decoder(tmp_path / "wide", intermediate_size=256)
    result = prune(recipe_for(model_dir, corpus, ratio=0.27, modules="neurons"))
    assert Recipe.model_validate(recipe_for(model_dir, corpus)).round_to.neurons == "auto"
    assert result.summary()["round_to_neurons"] == 16 and result.summary()["round_to_heads"] == 1
    assert all(len(lp.neurons) % 16 == 0 for lp in result.plan.layers)
    exact = prune(recipe_for(model_dir, corpus, ratio=0.27, modules="neurons", round_to={"neurons": 1}))
    assert exact.summary()["round_to_neurons"] == 1
    assert any(len(lp.neurons) % 16 for lp in exact.plan.layers)
