"""vLLM's DeciLM form as written, without a server (the fast twin of test_vllm.py, which serves it):
the per-layer block configs of a checkpoint whose layers keep the same number of query heads but
different key/value groups, FFN widths and biases; the refusals of what the form cannot hold."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from core.models.tiny import tiny_decoder
from core.serving.gguf_export import ExportError
from core.serving.vllm_form import check_vllm_family, export_vllm
from tests.core.serving.crafted import crafted_checkpoint

# 8 query heads of 64 over 4 key/value heads; each layer keeps 4 query heads, in groups of 2+2 over two
# key/value heads, 1+1+1+1 over four, and 2+1+1 (repeated to four key/value heads for vLLM)
LAYOUT = [
    {"heads": [0, 1, 2, 3], "kv_heads": [0, 1], "neurons": 48, "bias": ["mlp.down_proj"]},
    {"heads": [0, 2, 4, 6], "kv_heads": [0, 1, 2, 3], "neurons": 20, "bias": ["self_attn.o_proj"]},
    {"heads": [0, 1, 2, 4], "kv_heads": [0, 1, 2], "neurons": 33, "bias": ["self_attn.o_proj", "mlp.down_proj"]},
]


def _source(root, family: str):
    shape = dict(hidden_size=128, head_dim=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=64)
    src = tiny_decoder(root / f"{family}-src", family=family, tokenizer="bpe", num_hidden_layers=3, **shape)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(src)
    return src


def _checkpoint(root, family: str, layout: list[dict]):
    src = _source(root, family)
    return crafted_checkpoint(src, root / f"{family}-pruned", layout, family, seed=5, bias_scale=0.1)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_form_holds_each_layers_groups_widths_and_biases(family, tmp_path):
    ckpt = _checkpoint(tmp_path, family, LAYOUT)
    form = export_vllm(ckpt)
    config = json.loads((form / "config.json").read_text())
    blocks = config["block_configs"]
    assert [b["attention"]["n_heads_in_group"] for b in blocks] == [2, 1, 1]  # 4 query heads over 2, 4, 4 groups
    assert [b["ffn"]["intermediate_size"] for b in blocks] == [48, 20, 33]
    assert config["attention_bias"] and config["mlp_bias"]  # any layer's bias switches it on for all
    tensors = {}
    for shard in sorted(form.glob("*.safetensors")):
        tensors |= load_file(shard)
    for i, (kv, width) in enumerate(((2, 48), (4, 20), (4, 33))):  # 2+1+1 over three groups: repeated to 4
        pre = f"model.layers.{i}."
        assert tensors[pre + "self_attn.q_proj.weight"].shape == (4 * 64, 128)
        assert tensors[pre + "self_attn.k_proj.weight"].shape == (kv * 64, 128)
        assert tensors[pre + "mlp.down_proj.weight"].shape == (128, width)
        assert tensors[pre + "self_attn.o_proj.bias"].shape == (128,) and tensors[pre + "mlp.down_proj.bias"].shape == (
            128,
        )
    assert not tensors["model.layers.0.self_attn.o_proj.bias"].any()  # layer 0 had none: zeros
    assert tensors["model.layers.1.self_attn.o_proj.bias"].any()


def test_unequal_query_heads_per_layer_are_refused(tmp_path):
    layout = [dict(LAYOUT[0]), {**LAYOUT[1], "heads": [0, 2, 4], "kv_heads": [0, 1, 2]}, dict(LAYOUT[2])]
    ckpt = _checkpoint(tmp_path, "llama", layout)
    with pytest.raises(ExportError, match="keeps 3 to 4 heads per layer: prune with `heads: uniform`"):
        export_vllm(ckpt)
    assert not (tmp_path / "llama-pruned-vllm").exists()


def test_the_vllm_form_stays_with_the_llama_like_families():
    """GGUF writes Qwen3, Gemma and Phi-3 in llama.cpp's own architectures; vLLM's DeciLM form computes
    LLaMA's blocks only, so it keeps refusing them, naming its own families."""
    for model_type, label in (("gemma3_text", "Gemma 3 \\(text\\)"), ("qwen3", "Qwen3"), ("phi3", "Phi-3")):
        with pytest.raises(ExportError, match=f"^vLLM's DeciLM form writes the LLaMA, Mistral and Qwen2 families; "
                           f"this checkpoint is {label}"):  # fmt: skip
            check_vllm_family({"model_type": model_type})
