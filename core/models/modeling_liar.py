"""Modeling code for structurally pruned transformers (the decoder families of ``liar_families``, BERT).

This file is self-contained on purpose: it imports only ``torch`` and ``transformers`` and is copied
verbatim into every exported checkpoint, so a pruned model loads with
``AutoModel*.from_pretrained(dir, trust_remote_code=True)`` where this project is not installed.
The pruning engine uses the very same functions for in-memory surgery, so the exported model and
the in-memory one are built by one code path.

A pruned model is its stock architecture plus a per-layer *layout* stored in ``config.liar_layout``:

    {"heads": [kept query-head indices of the original layer],
     "kv_heads": [kept key/value-head indices of the original layer],
     "neurons": number of kept FFN neurons,
     "bias": [names of projections that carry a bias beyond the stock config]}

Grouped-query attention stays exact: query head ``h`` of the original model read key/value head
``h // n_rep``; after pruning, each kept query head still reads that same key/value head, through an
explicit per-layer index map (``kv_index``) whenever the kept heads no longer form equal groups:
the attention then sees a per-layer view of the config whose attention implementation gathers the
key/value heads before calling the model's own one, so each family's stock forward runs unchanged.
"""

from __future__ import annotations

import sys

import torch
import transformers
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.models.llama.modeling_llama import eager_attention_forward

from .liar_families import FAMILIES, Family


def get_layers(model: nn.Module, family: Family) -> nn.ModuleList:
    return model.base_model.get_submodule(family.layers)


def head_geometry(config) -> tuple[int, int, int]:
    """(num query heads, num key/value heads, head_dim) of the *original* model."""
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_heads, n_kv, head_dim


def set_module(parent: nn.Module, path: str, new: nn.Module) -> None:
    """Replace the submodule at dotted ``path`` of ``parent``."""
    owner, _, name = path.rpartition(".")
    setattr(parent.get_submodule(owner) if owner else parent, name, new)


def _slice_linear(lin: nn.Linear, rows: list[int] | None, cols: list[int] | None) -> nn.Linear:
    """A new Linear keeping output rows ``rows`` and input columns ``cols`` (None = all)."""
    w, b = lin.weight, lin.bias
    if rows is not None:
        idx = torch.tensor(rows, dtype=torch.long, device=w.device)
        w = w.index_select(0, idx)
        b = None if b is None else b.index_select(0, idx)
    if cols is not None:
        w = w.index_select(1, torch.tensor(cols, dtype=torch.long, device=w.device))
    # skip_init: no random initialisation of weights that are replaced at once
    new = torch.nn.utils.skip_init(
        nn.Linear, w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype
    )
    new.weight = nn.Parameter(w.detach().clone(), requires_grad=lin.weight.requires_grad)
    if b is not None:
        new.bias = nn.Parameter(b.detach().clone(), requires_grad=lin.bias.requires_grad)
    return new


def ensure_bias(lin: nn.Linear) -> None:
    """Give ``lin`` a (zero) bias if it has none."""
    if lin.bias is None:
        lin.bias = nn.Parameter(torch.zeros(lin.out_features, device=lin.weight.device, dtype=lin.weight.dtype))


def _channels(units: list[int], width: int) -> list[int]:
    """Channel indices covered by unit indices ``units`` of ``width`` channels each."""
    return [u * width + j for u in units for j in range(width)]


def kv_index_for(heads: list[int], kv_heads: list[int], n_rep: int) -> list[int]:
    """For each kept query head, the position of its original key/value head among the kept ones."""
    pos = {kv: i for i, kv in enumerate(kv_heads)}
    missing = sorted({h // n_rep for h in heads} - set(pos))
    if missing:
        raise ValueError(f"query heads {heads} read pruned key/value heads {missing}")
    return [pos[h // n_rep] for h in heads]


def _regular_groups(kv_index: list[int], n_kv: int) -> int | None:
    """The group size if kept query heads form equal, contiguous groups (stock GQA), else None."""
    if n_kv == 0 or len(kv_index) % n_kv:
        return None
    rep = len(kv_index) // n_kv
    return rep if kv_index == [i // rep for i in range(len(kv_index))] else None


KV_INDEXED = "liar_kv_indexed"  # attention implementation gathering key/value heads by an index first


def _kv_indexed_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own attention implementation, after query head i is given key/value head
    ``module.liar_kv_index[i]`` (the pruned block's kept heads no longer form equal groups). Registered
    with transformers, so every family's stock attention forward (rotary embeddings, q/k norms,
    soft-capping, sliding windows, the cache) runs unchanged."""
    index = _device_index(module, key.device)
    key, value = key.index_select(1, index), value.index_select(1, index)
    real = module.__dict__["config"]._attn_implementation
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(real, type(module).liar_eager)
    return interface(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(KV_INDEXED, _kv_indexed_attention)


class _LayerConfig:
    """A pruned attention's view of the model config: the attributes in ``overrides`` (its own head
    counts, the key/value-gathering implementation) and the model's config for everything else."""

    def __init__(self, base, overrides: dict):
        self.__dict__.update(_base=base, _overrides=overrides)

    def __getattr__(self, name):
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_base"], name)

    def __setattr__(self, name, value):
        setattr(self.__dict__["_base"], name, value)


def _get_config(attn):
    return _LayerConfig(attn.__dict__["config"], attn.__dict__.get("liar_config_overrides", {}))


def _set_config(attn, value):
    attn.__dict__["config"] = value


def _device_index(attn: nn.Module, device: torch.device) -> torch.Tensor:
    """``attn.liar_kv_index`` as a tensor on ``device`` (a plain attribute, cached per device, so that
    meta-device initialisation during ``from_pretrained`` cannot leave it uninitialised)."""
    cache = attn.__dict__.setdefault("_liar_kv_index_cache", {})
    if device not in cache:
        cache[device] = torch.tensor(attn.liar_kv_index, dtype=torch.long, device=device)
    return cache[device]


_LIAR_ATTENTION: dict[type, type] = {}  # stock attention class -> its subclass reading a _LayerConfig


def _set_config_overrides(attn: nn.Module, overrides: dict) -> None:
    """Give ``attn`` a per-layer config view with ``overrides``, or its stock class back if none."""
    stock = getattr(type(attn), "liar_stock", type(attn))
    if not overrides:
        attn.__class__ = stock
        attn.__dict__.pop("liar_config_overrides", None)
        return
    if stock not in _LIAR_ATTENTION:
        # the family's own eager attention (Gemma's soft-capping), looked up once per class
        eager = getattr(sys.modules[stock.__module__], "eager_attention_forward", eager_attention_forward)
        attrs = {"config": property(_get_config, _set_config), "liar_stock": stock, "liar_eager": staticmethod(eager)}
        _LIAR_ATTENTION[stock] = type("Liar" + stock.__name__, (stock,), attrs)
    attn.__class__ = _LIAR_ATTENTION[stock]
    attn.liar_config_overrides = overrides


def prune_layer_(
    layer: nn.Module,
    family: Family,
    config,
    heads: list[int] | torch.Tensor,
    kv_heads: list[int] | torch.Tensor,
    neurons: int | list[int] | torch.Tensor,
    bias: list[str] = (),
) -> None:
    """Physically remove heads and FFN neurons from one transformer block, in place.

    ``heads`` / ``kv_heads``: kept query / key-value head indices of the original block;
    ``neurons``: kept FFN neuron indices, or a count (keeps the first ``neurons``: used when loading,
    where the values come from the checkpoint). ``bias``: projections to give a zero bias.
    """
    prune_heads_(layer, family, config, heads, kv_heads)
    prune_neurons_(layer, family, neurons)
    for name in bias:
        ensure_bias(layer.get_submodule(name))


def _as_list(v) -> list[int]:
    return sorted(int(i) for i in (v.tolist() if isinstance(v, torch.Tensor) else v))


def prune_neurons_(layer: nn.Module, family: Family, neurons: int | list[int] | torch.Tensor) -> None:
    """Keep FFN neurons ``neurons`` (indices into the current layer, or a count) — rows of the FFN
    input projections (both halves of a fused gate/up projection) and columns of the FFN output."""
    n_cur = layer.get_submodule(family.ffn_out).in_features
    neurons = list(range(neurons)) if isinstance(neurons, int) else _as_list(neurons)
    if not neurons:
        raise ValueError("a layer must keep at least one FFN neuron")
    if neurons == list(range(n_cur)):
        return
    rows = neurons + [n_cur + n for n in neurons] if family.ffn_in_fused else neurons
    for path in family.ffn_in:
        set_module(layer, path, _slice_linear(layer.get_submodule(path), rows, None))
    set_module(layer, family.ffn_out, _slice_linear(layer.get_submodule(family.ffn_out), None, neurons))


def _slice_qkv(layer: nn.Module, family: Family, q_rows, kv_rows, n_q: int, n_kv: int) -> None:
    """Keep rows ``q_rows`` of the query projection and ``kv_rows`` of the key and value projections
    (None: all); ``n_q`` / ``n_kv``: their current row counts (for a fused q|k|v projection)."""
    if family.qkv_fused:
        q_rows = list(range(n_q)) if q_rows is None else q_rows
        kv_rows = list(range(n_kv)) if kv_rows is None else kv_rows
        rows = q_rows + [n_q + r for r in kv_rows] + [n_q + n_kv + r for r in kv_rows]
        set_module(layer, family.q, _slice_linear(layer.get_submodule(family.q), rows, None))
        return
    for path, rows in ((family.q, q_rows), (family.k, kv_rows), (family.v, kv_rows)):
        if rows is not None:
            set_module(layer, path, _slice_linear(layer.get_submodule(path), rows, None))


def prune_heads_(
    layer: nn.Module, family: Family, config, heads: list[int] | torch.Tensor, kv_heads: list[int] | torch.Tensor
) -> None:
    """Keep query heads ``heads`` and key/value heads ``kv_heads`` (original indices) — rows of q/k/v,
    columns of o — and make every kept query head read its original key/value head."""
    n_heads, n_kv, head_dim = head_geometry(config)
    heads, kv_heads = _as_list(heads), _as_list(kv_heads)
    if not family.gqa:
        kv_heads = heads
    attn = layer.get_submodule(family.attn)
    cur_heads = getattr(attn, "liar_heads", list(range(n_heads)))
    cur_kv = getattr(attn, "liar_kv_heads", list(range(n_kv)))
    if not set(heads) <= set(cur_heads) or not set(kv_heads) <= set(cur_kv):
        raise ValueError("can only remove heads that are still present")
    if not heads:
        raise ValueError("a layer must keep at least one attention head")
    # positions of the kept heads within the current (possibly already pruned) layer; None = all kept
    q_rows = None if heads == cur_heads else _channels([cur_heads.index(h) for h in heads], head_dim)
    kv_rows = None if kv_heads == cur_kv else _channels([cur_kv.index(h) for h in kv_heads], head_dim)
    if family.gqa:
        _slice_qkv(layer, family, q_rows, kv_rows, len(cur_heads) * head_dim, len(cur_kv) * head_dim)
    else:  # one row block per head in q, k and v alike
        _slice_qkv(layer, family, q_rows, q_rows, len(cur_heads) * head_dim, len(cur_heads) * head_dim)
    if q_rows is not None:
        set_module(layer, family.o, _slice_linear(layer.get_submodule(family.o), None, q_rows))

    attn.liar_heads, attn.liar_kv_heads = heads, kv_heads
    for name in family.head_count_attrs:
        setattr(attn, name, len(heads))
    for name in family.head_width_attrs:
        setattr(attn, name, len(heads) * head_dim)
    if hasattr(attn, "num_key_value_heads"):
        attn.num_key_value_heads = len(kv_heads)
    overrides = {}
    if family.heads_from_config and (len(heads), len(kv_heads)) != (n_heads, n_kv):
        overrides.update(num_attention_heads=len(heads), num_key_value_heads=len(kv_heads))
    if family.gqa:
        kv_index = kv_index_for(attn.liar_heads, attn.liar_kv_heads, n_heads // n_kv)
        rep = _regular_groups(kv_index, len(kv_heads))
        attn.num_key_value_groups = 1 if rep is None else rep  # stock GQA layout: no gather needed
        if rep is None:
            attn.liar_kv_index = kv_index
            attn.__dict__.pop("_liar_kv_index_cache", None)
            overrides["_attn_implementation"] = KV_INDEXED
    _set_config_overrides(attn, overrides)


def apply_layout(model: nn.Module, family_name: str, layout: list[dict]) -> None:
    """Shrink a freshly built stock model to the per-layer widths of ``layout`` (used when loading)."""
    family = FAMILIES[family_name]
    layers = get_layers(model, family)
    if len(layout) != len(layers):
        raise ValueError(f"layout has {len(layout)} layers, model has {len(layers)}")
    for layer, entry in zip(layers, layout):
        prune_layer_(
            layer,
            family,
            model.config,
            entry["heads"],
            entry["kv_heads"],
            int(entry["neurons"]),
            entry.get("bias", []),
        )


def _liar_classes(family_name: str, config_base: type, model_bases: dict[str, type]):
    config_cls = type(
        f"Liar{config_base.__name__}",
        (config_base,),
        # the stock model_type: the checkpoint's config then loads without remote code (AutoTokenizer
        # reads it, and would otherwise ask whether to trust the bundled code)
        {"model_type": config_base.model_type, "__module__": __name__},
    )

    out = {"config": config_cls}
    for auto_name, base in model_bases.items():
        cls = type(f"Liar{base.__name__}", (base,), {"config_class": config_cls, "__module__": __name__})

        def make_init(klass):
            def init(self, config, *args, **kwargs):
                super(klass, self).__init__(config, *args, **kwargs)
                apply_layout(self, config.liar_family, config.liar_layout)

            return init

        cls.__init__ = make_init(cls)
        out[auto_name] = cls
    return out


def _build_classes() -> dict[str, dict[str, type]]:
    """``{family: {"config": LiarXConfig, auto_name: LiarX…}}`` for every family, also bound as module
    names (``auto_map`` in a checkpoint's config names them)."""
    out = {}
    for name, fam in FAMILIES.items():
        bases = {auto: getattr(transformers, cls) for auto, cls in fam.model_classes.items()}
        out[name] = _liar_classes(name, getattr(transformers, fam.config_class), bases)
        for cls in out[name].values():
            globals()[cls.__name__] = cls
    return out


CLASSES = _build_classes()
