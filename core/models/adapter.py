"""A loaded model's family and geometry (:class:`Adapter`), and the parameter counts budgets use.

Families themselves are data in :mod:`core.models.liar_families`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from core.models.liar_families import Family, family_of, unsupported_reason
from core.models.modeling_liar import get_layers, head_geometry


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

    def row_blocks(self) -> dict[str, list[tuple[str, slice]]]:
        """Where the query, key, value and FFN-input rows of a dense block live: ``(projection path,
        rows)`` per role — a slice of a fused projection (Phi-3), all rows otherwise."""
        fam, d, every = self.family, self.head_dim, slice(None)
        nq, nkv = self.n_heads * d, (self.n_kv_heads if fam.gqa else self.n_heads) * d
        qkv = (slice(0, nq), slice(nq, nq + nkv), slice(nq + nkv, nq + 2 * nkv)) if fam.qkv_fused else (every,) * 3
        if fam.ffn_in_fused:
            ffn = [(fam.ffn_in[0], slice(0, self.n_neurons)), (fam.ffn_in[0], slice(self.n_neurons, None))]
        else:
            ffn = [(path, every) for path in fam.ffn_in]
        return {"q": [(fam.q, qkv[0])], "k": [(fam.k, qkv[1])], "v": [(fam.v, qkv[2])], "ffn_in": ffn}


def adapter_for(model_or_config) -> Adapter:
    config = getattr(model_or_config, "config", model_or_config)
    mt = getattr(config, "model_type", None)
    family = family_of(mt)
    if family is None:
        raise ValueError(unsupported_reason(mt))
    n_heads, n_kv, head_dim = head_geometry(config)
    return Adapter(
        name=family.name,
        family=family,
        kind=family.kind,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        hidden=config.hidden_size,
        n_neurons=getattr(config, family.ffn_width_key),
        n_layers=config.num_hidden_layers,
    )


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
    parts = 2 if fam.ffn_in_fused else 1  # a fused gate/up projection holds two rows per neuron
    neuron = parts * sum(rows(p) for p in fam.ffn_in) + layer.get_submodule(fam.ffn_out).out_features
    return {"head": head, "kv": kv, "neuron": neuron}
