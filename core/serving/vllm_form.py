"""A pruned checkpoint in the form vLLM serves per-layer widths in: ``DeciLMForCausalLM``.

vLLM's DeciLM (``vllm/model_executor/models/nemotron_nas.py``) builds each layer from
``block_configs[i]``: its key/value heads (``num_attention_heads // attention.n_heads_in_group``) and
its FFN width (``ffn.intermediate_size``, taken as it is when ``ffn_mult`` is absent). The query-head
count is the global ``num_attention_heads``, so every layer must keep the same number of query heads
(prune with ``heads: uniform`` for that); key/value heads and FFN widths may differ per layer.

The weights keep transformers' names and rotate-half rotary layout (vLLM's DeciLM rotates the same
way); per layer, the query heads are ordered by the key/value head they read and unequal groups get
their key/value heads repeated (:mod:`core.serving.layout`), which is exact. vLLM switches biases
on per model, not per layer: when any layer carries a bias on an output projection (reconstruction
adds one), every layer gets that bias (zeros where it had none); ``qkv_bias`` keeps Qwen2's query,
key and value biases. Written block by block to a sibling folder renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from core.models.config_file import read_config
from core.models.manifest import write_manifest
from core.models.safetensors_io import CheckpointError, CheckpointReader, write_shard
from core.serving.gguf_export import verify_checkpoint
from core.serving.layout import ExportError, LayerShape, Tensors, check_rope, head_rows, layers_of, served_family

CONFIG_FILE = Path(__file__).with_name("configuration_liar_deci.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
_DROP = ("liar_layout", "liar_family", "auto_map", "architectures", "model_type", "transformers_version")


def check_vllm_family(config: dict) -> None:
    """LLaMA, Mistral and Qwen2 (the families whose blocks DeciLM's LLaMA blocks compute) with a rotary
    scaling the form states; ``ExportError`` otherwise."""
    served_family(config)
    check_rope(config)


def vllm_layers(config: dict) -> tuple[list[LayerShape], int]:
    """The layers as vLLM's DeciLM will build them; ``ExportError`` when the form cannot state them."""
    check_vllm_family(config)
    layers, head_dim = layers_of(config)
    counts = sorted({x.n_head for x in layers})
    if len(counts) > 1:
        raise ExportError(
            f"vLLM's DeciLM states one query-head count for every layer, and this checkpoint keeps "
            f"{counts[0]} to {counts[-1]} heads per layer: prune with `heads: uniform` for a vLLM checkpoint "
            "(the GGUF export has no such limit)"
        )
    return layers, head_dim


def _biases(reader: CheckpointReader, n_layers: int) -> dict[str, bool]:
    """Which bias families any layer has (vLLM switches them on for the whole model)."""
    has = lambda proj: any(f"model.layers.{i}.{proj}.bias" in reader for i in range(n_layers))  # noqa: E731
    qkv = any(has(f"self_attn.{p}_proj") for p in "qkv")
    return {
        "o": has("self_attn.o_proj") or qkv,
        "qkv": qkv,
        "mlp": any(has(f"mlp.{p}_proj") for p in ("gate", "up", "down")),
    }


def _config(config: dict, layers: list[LayerShape], head_dim: int, bias: dict[str, bool]) -> dict:
    out = {k: v for k, v in config.items() if k not in _DROP}
    out.update(
        architectures=["DeciLMForCausalLM"],
        model_type="nemotron-nas",
        auto_map={"AutoConfig": f"{CONFIG_FILE.stem}.LiarDeciConfig"},
        num_attention_heads=layers[0].n_head,
        num_key_value_heads=max(x.n_kv for x in layers),
        intermediate_size=max(x.n_ff for x in layers),
        head_dim=head_dim,
        attention_bias=bias["o"],
        qkv_bias=bias["qkv"],
        mlp_bias=bias["mlp"],
        block_configs=[
            {
                "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": x.n_head // x.n_kv},
                "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": x.n_ff},
            }
            for x in layers
        ],
    )
    return out


def _block(src: Tensors, i: int, x: LayerShape, head_dim: int, bias: dict[str, bool]) -> list[tuple[str, torch.Tensor]]:
    pre = f"model.layers.{i}."
    out = [(pre + n, src.get(pre + n)) for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]

    def maybe(name: str, size: int) -> torch.Tensor:
        return src.get(name) if src.has(name) else torch.zeros(size)

    for proj, heads in (("q", x.q_heads), ("k", x.kv_rows), ("v", x.kv_rows)):
        name = f"{pre}self_attn.{proj}_proj."
        w = src.get(name + "weight")
        out.append((name + "weight", head_rows(w, heads, head_dim)))
        if bias["qkv"]:
            out.append((name + "bias", head_rows(maybe(name + "bias", w.shape[0]), heads, head_dim)))
    o = src.get(pre + "self_attn.o_proj.weight")
    out.append((pre + "self_attn.o_proj.weight", head_rows(o.T, x.q_heads, head_dim).T.contiguous()))
    if bias["o"]:
        out.append((pre + "self_attn.o_proj.bias", maybe(pre + "self_attn.o_proj.bias", o.shape[0])))
    for proj in ("gate", "up", "down"):
        name = f"{pre}mlp.{proj}_proj."
        w = src.get(name + "weight")
        out.append((name + "weight", w))
        if bias["mlp"]:
            out.append((name + "bias", maybe(name + "bias", w.shape[0])))
    return out


def export_vllm(
    directory: str | Path, out: str | Path | None = None, overwrite: bool = False, verify: bool = True
) -> Path:
    """Write the checkpoint in ``directory`` in vLLM's DeciLM form to the folder ``out`` (default:
    ``<checkpoint>-vllm`` beside it); serve it with ``vllm serve OUT --trust-remote-code``."""
    directory = Path(directory).expanduser()
    out = Path(out).expanduser() if out else directory.with_name(directory.name + "-vllm")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} exists and is not empty (pass overwrite to replace it)")
    config = read_config(directory)
    layers, head_dim = vllm_layers(config)
    try:
        reader = CheckpointReader(directory)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    if verify:
        verify_checkpoint(directory)
    bias = _biases(reader, len(layers))
    src = Tensors(reader, meta=False)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        shards = [
            [
                ("model.embed_tokens.weight", src.get("model.embed_tokens.weight")),
                ("model.norm.weight", src.get("model.norm.weight")),
            ]
        ]
        if src.has("lm_head.weight") and not config.get("tie_word_embeddings", False):
            shards[0].append(("lm_head.weight", src.get("lm_head.weight")))
        weight_map, digests = {}, {}
        for k in range(len(layers) + 1):
            tensors = shards[0] if k == 0 else _block(src, k - 1, layers[k - 1], head_dim, bias)
            name = f"model-{k:05d}-of-{len(layers) + 1:05d}.safetensors"
            digests[name] = write_shard(tmp / name, tensors)
            weight_map.update({t: name for t, _ in tensors})
        index = {"metadata": {}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(_config(config, layers, head_dim, bias), indent=2) + "\n")
        shutil.copyfile(CONFIG_FILE, tmp / CONFIG_FILE.name)
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (directory / name).is_file():
                shutil.copyfile(directory / name, tmp / name)
        write_manifest(tmp, digests)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
