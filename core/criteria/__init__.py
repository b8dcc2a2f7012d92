"""Pruning criteria, one module each; importing this package registers them all in ``REGISTRY``."""

from core.criteria import flap, kcm, kwon, magnitude, obs, random_baseline, snip, taylor  # noqa: F401  (registration)
from core.criteria.base import REGISTRY, Criterion, LayerInputs, Scores
from core.spec.criteria import parse_options

__all__ = ["REGISTRY", "Criterion", "LayerInputs", "Scores", "get"]


def get(name: str) -> Criterion:
    if name not in REGISTRY:
        raise ValueError(f"unknown criterion {name!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def score_layer(name: str, layer, adapter, layer_idx: int, options: dict | None = None, data=None) -> Scores:
    """Score one layer with criterion ``name`` and plain ``options`` (validated against its schema)."""
    return get(name).score(layer, adapter, layer_idx, parse_options(name, options or {}), data)
