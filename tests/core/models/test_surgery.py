"""Physical removal of heads and neurons equals masking them in the dense model."""

import copy

import pytest
import torch

from core.models.adapter import adapter_for
from core.models.loading import load_model
from core.models.modeling_liar import prune_layer_
from tests.conftest import NEW_FAMILIES


def _inputs(adapter, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (3, 17), generator=gen)
    mask = torch.ones_like(ids)
    if adapter.kind == "encoder":
        mask[1, 12:] = 0  # padding in one sample
    return ids, mask


def _out(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _mask_dense(model, adapter, keep_heads, keep_neurons):
    """Zero the o_proj input columns of dropped heads and the down_proj columns of dropped neurons."""
    fam = adapter.family
    with torch.no_grad():
        for layer, heads, neurons in zip(adapter.layers(model), keep_heads, keep_neurons):
            o = layer.get_submodule(fam.o).weight
            for h in range(adapter.n_heads):
                if h not in heads:
                    o[:, h * adapter.head_dim : (h + 1) * adapter.head_dim] = 0
            d = layer.get_submodule(fam.ffn_out).weight
            drop = torch.ones(d.shape[1], dtype=torch.bool)
            drop[neurons] = False
            d[:, drop] = 0


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "bert", *NEW_FAMILIES])
def test_keep_all_preserves_outputs_exactly(name, request):
    model, _, adapter = load_model(str(request.getfixturevalue(f"{name}_dir")), "float32", "cpu")
    ids, mask = _inputs(adapter)
    before = _out(model, ids, mask)
    for layer in adapter.layers(model):
        prune_layer_(
            layer,
            adapter.family,
            model.config,
            list(range(adapter.n_heads)),
            list(range(adapter.n_kv_heads)),
            adapter.n_neurons,
        )
    assert torch.equal(before, _out(model, ids, mask))


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "bert", *NEW_FAMILIES])
def test_surgery_equals_masking(name, request):
    model, _, adapter = load_model(str(request.getfixturevalue(f"{name}_dir")), "float32", "cpu")
    ids, mask = _inputs(adapter)
    if adapter.family.gqa:  # irregular groups: 3 query heads on kv 0, 1 on kv 1, kv 2 gone, 2 on kv 3
        keep_heads = [[0, 1, 3, 6, 7], [2, 3, 4, 5]]
    else:
        keep_heads = [[0, 2, 3], [1]]
    keep_neurons = [torch.tensor([0, 3, 4, 10, 20, 47]), torch.arange(0, 48, 2)]
    dense = copy.deepcopy(model)
    _mask_dense(dense, adapter, keep_heads, keep_neurons)
    expected = _out(dense, ids, mask)
    n_rep = adapter.n_rep
    for layer, heads, neurons in zip(adapter.layers(model), keep_heads, keep_neurons):
        kv = sorted({h // n_rep for h in heads}) if adapter.family.gqa else heads
        prune_layer_(layer, adapter.family, model.config, heads, kv, neurons)
    got = _out(model, ids, mask)
    if got.ndim == 3:  # hidden states: compare real tokens only
        m = mask.bool()
        got, expected = got[m], expected[m]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    fam = adapter.family
    layer0 = adapter.layers(model)[0]
    d, n_kv = adapter.head_dim, (3 if fam.gqa else len(keep_heads[0]))  # kv head 2 removed
    if fam.qkv_fused:  # q | k | v rows of one projection
        assert layer0.get_submodule(fam.q).out_features == (len(keep_heads[0]) + 2 * n_kv) * d
    else:
        assert layer0.get_submodule(fam.q).out_features == len(keep_heads[0]) * d
        assert layer0.get_submodule(fam.k).out_features == n_kv * d
    assert layer0.get_submodule(fam.ffn_out).in_features == len(keep_neurons[0])
    parts = 2 if fam.ffn_in_fused else 1
    assert all(layer0.get_submodule(p).out_features == parts * len(keep_neurons[0]) for p in fam.ffn_in)


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_gqa_decode_with_cache_matches_full_forward(name, request):
    """The indexed key/value map also holds during cached generation."""
    model, _, adapter = load_model(str(request.getfixturevalue(f"{name}_dir")), "float32", "cpu")
    for layer in adapter.layers(model):
        prune_layer_(layer, adapter.family, model.config, [0, 1, 3, 6], [0, 1, 3], 30)
    ids = torch.randint(5, 40, (1, 12))
    full = model(input_ids=ids).logits[:, -1]
    out = model(input_ids=ids[:, :-1], use_cache=True)
    step = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_cannot_drop_every_head(llama_dir):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    with pytest.raises(ValueError, match="at least one attention head"):
        prune_layer_(adapter.layers(model)[0], adapter.family, model.config, [], [], 10)


def test_adapter_rejects_unknown_architecture():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model type 'gpt2' is not a supported architecture"):
        adapter_for(GPT2Config())
