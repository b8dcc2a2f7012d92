"""Modeling code for structurally pruned transformers (LLaMA family with GQA, BERT family).

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
explicit per-layer index map (``kv_index``) whenever the kept heads no longer form equal groups.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

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


def indexed_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs
):
    """LLaMA-family attention where query head i reads key/value head ``self.kv_index[i]``."""
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    index = _device_index(self, key.device)
    key = key.index_select(1, index)
    value = value.index_select(1, index)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
    if getattr(self, "sliding_window", None) is not None:
        kwargs.setdefault("sliding_window", self.sliding_window)
    out, weights = interface(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _device_index(attn: nn.Module, device: torch.device) -> torch.Tensor:
    """``attn.liar_kv_index`` as a tensor on ``device`` (a plain attribute, cached per device, so that
    meta-device initialisation during ``from_pretrained`` cannot leave it uninitialised)."""
    cache = attn.__dict__.setdefault("_liar_kv_index_cache", {})
    if device not in cache:
        cache[device] = torch.tensor(attn.liar_kv_index, dtype=torch.long, device=device)
    return cache[device]


_INDEXED_CLASSES: dict[type, type] = {}


def _indexed_class(base: type) -> type:
    if base not in _INDEXED_CLASSES:
        _INDEXED_CLASSES[base] = type("Indexed" + base.__name__, (base,), {"forward": indexed_attention_forward})
    return _INDEXED_CLASSES[base]


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
    input projections and columns of the FFN output projection."""
    n_cur = layer.get_submodule(family.ffn_out).in_features
    neurons = list(range(neurons)) if isinstance(neurons, int) else _as_list(neurons)
    if not neurons:
        raise ValueError("a layer must keep at least one FFN neuron")
    if neurons == list(range(n_cur)):
        return
    for path in family.ffn_in:
        set_module(layer, path, _slice_linear(layer.get_submodule(path), neurons, None))
    set_module(layer, family.ffn_out, _slice_linear(layer.get_submodule(family.ffn_out), None, neurons))


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
    for path, rows in ((family.q, q_rows), (family.k, kv_rows), (family.v, kv_rows)):
        if rows is not None:
            set_module(layer, path, _slice_linear(layer.get_submodule(path), rows, None))
    if q_rows is not None:
        set_module(layer, family.o, _slice_linear(layer.get_submodule(family.o), None, q_rows))

    attn.liar_heads, attn.liar_kv_heads = heads, kv_heads
    if family.gqa:
        kv_index = kv_index_for(attn.liar_heads, attn.liar_kv_heads, n_heads // n_kv)
        rep = _regular_groups(kv_index, len(kv_heads))
        if rep is not None:  # stock GQA layout: no gather needed
            if type(attn) in _INDEXED_CLASSES.values():
                attn.__class__ = attn.__class__.__bases__[0]
            attn.num_key_value_groups = rep
        else:
            if type(attn) not in _INDEXED_CLASSES.values():
                attn.__class__ = _indexed_class(type(attn))
            attn.num_key_value_groups = 1
            attn.liar_kv_index = kv_index
            attn.__dict__.pop("_liar_kv_index_cache", None)
    else:  # BERT: the forward reshapes with -1, only bookkeeping attributes change
        attn.num_attention_heads = len(heads)
        attn.all_head_size = len(heads) * head_dim


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
        {"model_type": f"liar_{family_name}", "__module__": __name__},
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
