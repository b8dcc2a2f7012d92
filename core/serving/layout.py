"""What both engine forms share: the families and rotary scalings they can state (GGUF a few more
families than vLLM's DeciLM form), the kept heads of a pruned layer as an engine's stock grouped-query
attention, and tensor reading.

An engine's attention has one group size per layer: query head ``i`` reads key/value head
``i // group``. A pruned layer's kept query heads may sit in unequal groups over its kept key/value
heads (3 heads on one, 1 on the next). :func:`layer_shape` (``core.models.serving_forms``, torch-free,
which also decides each family's GGUF architecture) orders the query heads by the key/value head they
read and repeats each key/value head so that every group has the groups' greatest common size: the same
attention, exactly, in the form both GGUF (llama.cpp) and vLLM's DeciLM state.
"""

from __future__ import annotations

import torch

from core.models.liar_families import FAMILIES
from core.models.safetensors_io import CheckpointReader
from core.models.serving_forms import (
    GGUF_FAMILIES,
    SERVED_FAMILIES,
    ExportError,
    LayerShape,
    layer_shape,
    layers_of,
)

SCALING_BY_FACTOR = ("default", "linear", "llama3")  # rotary types that divide each frequency by a constant


def served_family(config: dict) -> str:
    """The checkpoint's family when vLLM's DeciLM form can state it (LLaMA, Mistral, Qwen2), else
    ``ExportError`` naming the families that work."""
    model_type = config.get("model_type")
    for name in SERVED_FAMILIES:
        if model_type in FAMILIES[name].model_types:
            return name
    label = next((f.label or f.name for f in FAMILIES.values() if model_type in f.model_types), model_type)
    raise ExportError(
        f"vLLM's DeciLM form writes the LLaMA, Mistral and Qwen2 families; this checkpoint is {label} "
        f"(model_type {model_type!r}); it still loads in transformers"
    )


def gguf_family(config: dict) -> str:
    """The checkpoint's family when GGUF export can state it, else ``ExportError`` naming those that work."""
    model_type = config.get("model_type")
    for name in GGUF_FAMILIES:
        if model_type in FAMILIES[name].model_types:
            return name
    label = next((f.label or f.name for f in FAMILIES.values() if model_type in f.model_types), model_type)
    names = [FAMILIES[n].label for n in GGUF_FAMILIES]
    raise ExportError(
        f"GGUF export writes the {', '.join(names[:-1])} and {names[-1]} families; this checkpoint is {label} "
        f"(model_type {model_type!r}); it still loads in transformers"
    )


def rope(config: dict) -> dict:
    """The config's rotary settings, old (``rope_theta`` / ``rope_scaling``) or new (``rope_parameters``)."""
    out = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    out.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    out.setdefault("rope_type", out.get("type", "default"))
    return out


def check_rope(config: dict) -> None:
    kind = rope(config)["rope_type"]
    if kind not in SCALING_BY_FACTOR:
        raise ExportError(
            f"rotary scaling {kind!r} has no exact GGUF form here; GGUF export writes {', '.join(SCALING_BY_FACTOR)}"
        )


def head_rows(w: torch.Tensor, heads: list[int], head_dim: int) -> torch.Tensor:
    """The row blocks of ``heads`` (in that order) of a per-head projection or its bias."""
    index = torch.tensor([h * head_dim + j for h in heads for j in range(head_dim)], device=w.device)
    return w.index_select(0, index)


class Tensors:
    """A checkpoint's tensors by Hugging Face name, as float32 CPU tensors, or (``meta``) as shapes only:
    the writer runs the same conversion twice, first on shapes for the file's tensor table, then on
    the data, so no more than one tensor is in memory at a time."""

    def __init__(self, reader: CheckpointReader, meta: bool):
        self.reader, self.meta = reader, meta

    def has(self, name: str) -> bool:
        return name in self.reader

    def get(self, name: str) -> torch.Tensor:
        if self.meta:
            return torch.empty(self.reader.entries[name].shape, device="meta")
        return self.reader.read(name, dtype=torch.float32)


__all__ = [
    "GGUF_FAMILIES",
    "SERVED_FAMILIES",
    "ExportError",
    "LayerShape",
    "Tensors",
    "check_rope",
    "gguf_family",
    "head_rows",
    "layer_shape",
    "layers_of",
    "rope",
    "served_family",
]
