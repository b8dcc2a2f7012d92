"""Model families described as data, and loading of models + tokenizers (hub id or local dir).

The structural table (which module is q/k/v/o, gate/up/down, …) lives in
``core/modeling/modeling_liar.py`` because exported checkpoints carry that file; this module maps
Hugging Face ``model_type`` values onto it. Supporting a new LLaMA-like family is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from core.modeling.modeling_liar import FAMILIES, Family, get_layers, head_geometry

# Hugging Face model_type → (family, kind)
MODEL_TYPES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "decoder"),
    "mistral": ("mistral", "decoder"),
    "qwen2": ("qwen2", "decoder"),
    "bert": ("bert", "encoder"),
    "liar_llama": ("llama", "decoder"),
    "liar_mistral": ("mistral", "decoder"),
    "liar_qwen2": ("qwen2", "decoder"),
    "liar_bert": ("bert", "encoder"),
}


@dataclass
class Adapter:
    """A loaded model's family and geometry."""

    name: str
    family: Family
    kind: str  # "decoder" | "encoder"
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    n_neurons: int
    n_layers: int

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return get_layers(model, self.family)


def adapter_for(model_or_config) -> Adapter:
    config = getattr(model_or_config, "config", model_or_config)
    mt = getattr(config, "model_type", None)
    if mt not in MODEL_TYPES:
        raise ValueError(
            f"model type {mt!r} is not supported; supported: {sorted(k for k in MODEL_TYPES if '_' not in k)}"
        )
    name, kind = MODEL_TYPES[mt]
    n_heads, n_kv, head_dim = head_geometry(config)
    return Adapter(
        name=name,
        family=FAMILIES[name],
        kind=kind,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        hidden=config.hidden_size,
        n_neurons=config.intermediate_size,
        n_layers=config.num_hidden_layers,
    )


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str, config, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32  # half precision matmuls are slow and inexact on CPUs
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    return stored if stored in (torch.float16, torch.bfloat16) else torch.float32


def _model_class(config, kind: str):
    import transformers

    archs = getattr(config, "architectures", None) or []
    for arch in archs:
        if kind == "encoder" and "ForSequenceClassification" in arch:
            return transformers.AutoModelForSequenceClassification
        if kind == "encoder" and "ForQuestionAnswering" in arch:
            return transformers.AutoModelForQuestionAnswering
    return transformers.AutoModelForCausalLM if kind == "decoder" else transformers.AutoModel


def load_model(name: str, dtype: str = "auto", device: str = "auto"):
    """Load ``(model, tokenizer, adapter)`` from a hub id or a local directory, in eval mode."""
    from transformers import AutoConfig, AutoTokenizer

    local = Path(name).expanduser()
    src = str(local) if local.is_dir() else name
    if (local / "config.json").is_file():
        import json

        if json.loads((local / "config.json").read_text()).get("model_type", "").startswith("liar_"):
            from core.export import load_pruned

            dev = resolve_device(device)
            model, tokenizer = load_pruned(local, dtype=None if dtype == "auto" else getattr(torch, dtype), device=dev)
            if dev.type == "cpu" and dtype == "auto":
                model = model.float()
            return model, tokenizer, adapter_for(model)
    try:
        config = AutoConfig.from_pretrained(src)
    except Exception as exc:
        raise RuntimeError(
            f"could not load the model config of {name!r} ({type(exc).__name__}: {exc}). Give a local "
            "directory with config.json, or a Hugging Face id reachable from this machine."
        ) from exc
    adapter = adapter_for(config)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, dev)
    model = _model_class(config, adapter.kind).from_pretrained(src, dtype=torch_dtype).to(dev).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:
        raise RuntimeError(f"could not load a tokenizer for {name!r}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, adapter


def max_positions(config) -> int | None:
    return getattr(config, "max_position_embeddings", None)


def block_parameters(model: nn.Module, adapter: Adapter) -> int:
    return sum(p.numel() for layer in adapter.layers(model) for p in layer.parameters())


def unit_costs(layer: nn.Module, adapter: Adapter) -> dict[str, int]:
    """Parameters removed by one query head, one key/value group (k and v rows) and one FFN neuron."""
    fam, d = adapter.family, adapter.head_dim

    def rows(path: str) -> int:  # params of `d` output rows (incl. bias) of a projection
        lin = layer.get_submodule(path)
        return lin.in_features + (lin.bias is not None)

    o_cols = layer.get_submodule(fam.o).out_features
    head = d * (rows(fam.q) + o_cols)
    kv = d * (rows(fam.k) + rows(fam.v))
    if not fam.gqa:  # BERT: a head owns its key and value rows
        head, kv = head + kv, 0
    neuron = sum(rows(p) for p in fam.ffn_in) + layer.get_submodule(fam.ffn_out).out_features
    return {"head": head, "kv": kv, "neuron": neuron}
