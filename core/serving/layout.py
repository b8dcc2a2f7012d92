"""What both engine forms share: the families and rotary scalings they can state (GGUF a few more), the kept heads of a
pruned layer as an engine's stock grouped-query attention, and tensor reading.

An engine's attention has one group size per layer: query head ``i`` reads key/value head
``i // group``. A pruned layer's kept query heads may sit in unequal groups over its kept key/value
heads (3 heads on one, 1 on the next). :func:`layer_shape` orders the query heads by the key/value
head they read and repeats each key/value head so that every group has the groups' greatest common
size: the same attention, exactly, in the form both GGUF (llama.cpp) and vLLM's DeciLM state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.models.export import SERVED_FAMILIES
from core.models.liar_families import FAMILIES
from core.models.safetensors_io import CheckpointReader

SCALING_BY_FACTOR = ("default", "linear", "llama3")  # rotary types that divide each frequency by a constant


class ExportError(ValueError):
    """The checkpoint cannot be written in a serving form (the message says why and what would work)."""


def served_family(config: dict) -> str:
    """The checkpoint's family when the engine forms can state it (LLaMA, Mistral, Qwen2), else
    ``ExportError`` naming the families that work."""
    model_type = config.get("model_type")
    for name in SERVED_FAMILIES:
        if model_type in FAMILIES[name].model_types:
            return name
    label = next((f.label or f.name for f in FAMILIES.values() if model_type in f.model_types), model_type)
    raise ExportError(
        f"GGUF export writes the LLaMA, Mistral and Qwen2 families; this checkpoint is {label} "
        f"(model_type {model_type!r}); it still loads in transformers"
    )


# the families GGUF export writes: those both engine forms state, and four it writes in their own llama.cpp
# architecture (phi3 also as `llama`/`deci`)
GGUF_FAMILIES = (*SERVED_FAMILIES, "qwen3", "gemma2", "gemma3", "phi3")


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


@dataclass(frozen=True)
class LayerShape:
    """One block as an engine's attention sees it."""

    q_heads: list[int]  # the checkpoint's query heads (positions in q_proj), in the engine's order
    kv_rows: list[int]  # for each of the engine's key/value heads, its position in the checkpoint's k/v
    n_ff: int

    @property
    def n_head(self) -> int:
        return len(self.q_heads)

    @property
    def n_kv(self) -> int:
        return len(self.kv_rows)


def layer_shape(entry: dict, n_heads: int, n_kv: int) -> LayerShape:
    """The engine's view of a layer keeping query heads ``entry['heads']`` over key/value heads
    ``entry['kv_heads']`` (original indices; ``n_heads`` over ``n_kv`` in the unpruned model)."""
    heads, kv_heads, rep = list(entry["heads"]), list(entry["kv_heads"]), n_heads // n_kv
    position = {kv: i for i, kv in enumerate(kv_heads)}
    reads = [position[h // rep] for h in heads]  # each kept query head's key/value head (checkpoint position)
    order = sorted(range(len(heads)), key=lambda i: reads[i])  # stable: groups become contiguous
    sizes = [reads.count(j) for j in range(len(kv_heads)) if reads.count(j)]
    group = math.gcd(*sizes)
    kv_rows = [j for j in range(len(kv_heads)) for _ in range(reads.count(j) // group)]
    return LayerShape(q_heads=order, kv_rows=kv_rows, n_ff=int(entry["neurons"]))


def layers_of(config: dict) -> tuple[list[LayerShape], int]:
    """Every block of a checkpoint (``liar_layout`` or, for a stock one, the config's widths) and the
    head size."""
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    head_dim = config.get("head_dim") or config["hidden_size"] // n_heads
    layout = config.get("liar_layout")
    if layout is None:
        full = {"heads": list(range(n_heads)), "kv_heads": list(range(n_kv)), "neurons": config["intermediate_size"]}
        layout = [full] * config["num_hidden_layers"]
    return [layer_shape(e, n_heads, n_kv) for e in layout], head_dim


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
