"""The template every model family passes (``docs/design.md``, "Adding a model family").

A new family gets a tiny random config in ``core.models.tiny`` and a ``<family>_dir`` fixture, then
joins ``NEW_FAMILIES`` in ``tests/conftest.py``: these tests, the surgery tests (keep-all exactness,
surgery = masking, cached decoding) and the export tests (reload in both forms, without this
project) all run on it. The first three families (llama, mistral, qwen2) run the same template
here and in the older per-feature tests.
"""

import pytest
import torch

from core import prune
from core.evaluation.perplexity import perplexity, perplexity_streamed
from core.models.liar_families import FAMILIES
from core.models.loading import load_model, load_pruned
from core.pipeline.preflight import preflight
from core.spec.recipe import Recipe
from tests.conftest import DECODER_FAMILIES, recipe_for
from tests.core.models.test_streaming import _assert_same_checkpoint, _both
from tests.core.pipeline.test_pipeline import _logits, slow_reference


@pytest.mark.parametrize("method", ["liar", "ls"])
@pytest.mark.parametrize("name", DECODER_FAMILIES)
def test_pipeline_equals_slow_reference(name, method, request, corpus):
    """Replayed blocks (skipped norms, the bypassed inline activation of OPT), per-layer masks and
    rotary embeddings (Gemma's sliding-window layers) and fused projections (Phi-3) give the result
    of plain whole-model forwards. Statistics in float64, as the reference's: this checks the data
    flow, not the float32 products' rounding, which OPT's ReLU FFN (channels live on a handful of
    tokens) amplifies through ``ls``'s centred covariance to ~1e-4 of the logits, more or less
    depending on the CPU's kernels (``docs/results/gram_precision.md`` measures that rounding)."""
    recipe = Recipe.model_validate(
        recipe_for(
            request.getfixturevalue(f"{name}_dir"),
            corpus,
            ratio=0.4,
            reconstruction={"method": method, "damp": 1e-3},
            calibration={"holdout_samples": 0},
            stats_dtype="float64",
        )
    )
    result = prune(recipe)
    ref, plan = slow_reference(recipe)
    assert [lp.heads for lp in plan.layers] == [lp.heads for lp in result.plan.layers]
    assert any(len(lp.heads) < result.adapter.n_heads for lp in plan.layers)
    with torch.no_grad():
        got, expected = _logits(result.model, result.tokenizer, "decoder"), _logits(ref, result.tokenizer, "decoder")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", DECODER_FAMILIES)
def test_streamed_equals_in_memory(name, request, corpus, tmp_path):
    memory, memory_dir, streamed, stream_dir = _both(
        request.getfixturevalue(f"{name}_dir"), corpus, tmp_path, allocation="global"
    )
    assert [lp.heads for lp in streamed.plan.layers] == [lp.heads for lp in memory.plan.layers]
    for a, b in zip(memory.report, streamed.report, strict=True):
        assert b.error_after == pytest.approx(a.error_after, rel=1e-6, abs=1e-9)
    _assert_same_checkpoint(memory_dir, stream_dir)


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "opt"])
def test_streamed_perplexity_equals_in_memory(name, request, corpus):
    """Block by block with each layer's own mask and rotary embeddings (Gemma's sliding window of 8
    is shorter than these windows) and the final logit soft-capping (Gemma 2)."""
    path = request.getfixturevalue(f"{name}_dir")
    model, tokenizer = load_pruned(path)
    expected = perplexity(model, tokenizer, corpus[:10], seq_len=32, batch_size=3)
    got = perplexity_streamed(path, tokenizer, corpus[:10], seq_len=32, batch_size=3, device="cpu")
    assert got["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-5)


def test_sliding_window_layers_get_their_own_masks(gemma2_dir):
    """The tiny Gemma's sliding-window layer really differs from a full-attention one on these
    windows, so the per-layer arguments above are exercised, not vacuous."""
    from core.models.streaming import block_inputs

    model, _, adapter = load_model(str(gemma2_dir), "float32", "cpu")
    _, extra = block_inputs(model, adapter, [{"input_ids": torch.randint(5, 40, (1, 24)), "use_cache": False}])
    (_, sliding), (_, full) = extra[0]
    assert not torch.equal(sliding["attention_mask"], full["attention_mask"])


@pytest.mark.parametrize("name", ["phi3", "qwen3"])
def test_taylor_reads_each_part_of_a_fused_projection(name, request, corpus):
    """Taylor scores of heads and neurons (first order, summed) equal those computed from the q, k,
    v / gate, up weights taken apart by hand — for Phi-3's fused projections and Qwen3's separate ones."""
    from core.criteria.gradients import prunable_weights, weight_gradients
    from core.criteria.taylor import Taylor
    from core.data.calibration import decoder_windows, load_texts
    from core.spec.criteria import parse_options

    model, tok, adapter = load_model(str(request.getfixturevalue(f"{name}_dir")), "float32", "cpu")
    cfg = Recipe.model_validate(recipe_for("unused", corpus)).calibration
    fit, _ = decoder_windows(load_texts(cfg), tok, cfg)
    grads = weight_gradients(model, adapter, [fit])
    opts = parse_options("taylor", {"aggregation": "sum"})
    layer = adapter.layers(model)[0]
    scores = Taylor().score(layer, adapter, 0, opts, grads[0])

    fam, d, n_rep = adapter.family, adapter.head_dim, adapter.n_rep
    w = prunable_weights(layer, adapter)
    sal = {p: (w[p] * grads[0].grad[p]).abs() for p in w}
    rows = lambda p: sal[p].sum(1)  # noqa: E731
    nq, nkv, n = adapter.n_heads * d, adapter.n_kv_heads * d, adapter.n_neurons
    if fam.qkv_fused:
        q, k, v = rows(fam.q)[:nq], rows(fam.q)[nq : nq + nkv], rows(fam.q)[nq + nkv :]
        gate, up = rows(fam.ffn_in[0])[:n], rows(fam.ffn_in[0])[n:]
    else:
        q, k, v = rows(fam.q), rows(fam.k), rows(fam.v)
        gate, up = rows(fam.ffn_in[0]), rows(fam.ffn_in[1])
    kv_of = torch.arange(adapter.n_heads) // n_rep
    heads = (q.reshape(-1, d) + k.reshape(-1, d)[kv_of] / n_rep + v.reshape(-1, d)[kv_of] / n_rep).sum(1) + sal[
        fam.o
    ].sum(0).reshape(-1, d).sum(1)
    neurons = gate + up + sal[fam.ffn_out].sum(0)
    torch.testing.assert_close(scores.heads, heads.cpu(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores.neurons, neurons.cpu(), rtol=1e-5, atol=1e-6)


def test_unsupported_family_is_refused_before_any_work_naming_the_supported_ones(tmp_path):
    """A mixture-of-experts model is refused at validation time (preflight reads only config.json)."""
    (tmp_path / "config.json").write_text('{"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}')
    recipe = Recipe.model_validate({"model": str(tmp_path), "ratio": 0.2, "calibration": {"texts": ["a b c"]}})
    with pytest.raises(ValueError) as info:
        preflight(recipe)
    message = str(info.value)
    assert "mixtral" in message and "mixture-of-experts" in message
    for name in ("Gemma 2", "Gemma 3", "Phi-3", "Qwen3", "OPT"):
        assert name in message


def test_every_family_has_a_tiny_model_and_a_template_fixture(request):
    """A family added to the table without joining the template is caught here."""
    decoders = [name for name, fam in FAMILIES.items() if fam.kind == "decoder"]
    assert len(decoders) == 8
    assert set(decoders) == set(DECODER_FAMILIES)
    for name in decoders:
        assert request.getfixturevalue(f"{name}_dir").is_dir()
