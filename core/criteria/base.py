"""Pruning criteria: what a criterion is, and the registry the pipeline finds them in.

A criterion scores every attention head and FFN neuron of each layer (higher = keep); scores index
the layer's *original* query heads and neurons. Each criterion is one module of this package with a
:class:`Criterion` subclass declaring what it needs from the pipeline:

- ``needs = "weights"``: nothing but the layer (magnitude, random);
- ``needs = "inputs"``: per-channel statistics of the dense model's o_proj / down_proj inputs
  (:class:`LayerInputs`; FLAP, KCM), or with ``second_order`` their Gram statistics
  (:class:`GramInputs`; obs);
- ``needs = "gradients"``: gradients of the calibration loss, of the structure masks
  (``gradients = "mask"``: SNIP, Kwon) or of the prunable weights (``"weight"``: Taylor).

Its options are validated by the schema named in ``core.spec.criteria`` (torch-free). A new
criterion is a module here with a registered subclass, plus its options model there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from core.models.adapter import Adapter
from core.spec.criteria import CRITERION_OPTIONS, CriterionOptions
from core.stats.accumulate import ChannelStats, InputStats, OutputGain


@dataclass
class Scores:
    heads: torch.Tensor  # (n_heads,)
    neurons: torch.Tensor  # (n_neurons,)
    # True when scores are comparable across layers and between heads and neurons (standardised):
    # global allocation then ranks by score, weighting units by their parameters (FLAP's AL-AM);
    # otherwise it ranks by score per parameter removed.
    comparable: bool = False
    # False: this layer's heads / neurons are never pruned (e.g. LLM-Pruner's layer ranges)
    prunable_heads: bool = True
    prunable_neurons: bool = True
    # True where a unit lies past a soft per-layer cap: global allocation takes such units only after
    # every other unit of every layer (criterion obs with over_cap: last)
    over_cap_heads: torch.Tensor | None = None  # (n_heads,) bool
    over_cap_neurons: torch.Tensor | None = None  # (n_neurons,) bool
    # per-sample mask gradients for Kwon et al.'s per-layer mask rearrangement
    head_samples: torch.Tensor | None = None  # (n_samples, n_heads)
    neuron_samples: torch.Tensor | None = None  # (n_samples, n_neurons)


@dataclass
class LayerInputs:
    """Per-channel statistics of the inputs of the attention's output projection and of the FFN's, on
    the dense model (``needs = "inputs"``)."""

    attn: ChannelStats | None = None
    ffn: ChannelStats | None = None


@dataclass
class GramInputs:
    """What a ``second_order`` criterion (obs) gets instead of :class:`LayerInputs`: the Gram
    statistics of the same inputs (their per-channel sums are in them), the mean squared norm of the
    residual stream entering the block (per token), and the squared gains of the norms on o_proj's /
    the FFN's outputs (families with sandwich norms; else None)."""

    attn_gram: InputStats
    ffn_gram: InputStats
    residual: ChannelStats
    attn_gain: OutputGain | None = None
    ffn_gain: OutputGain | None = None


class Criterion:
    """One pruning criterion. Subclasses set the class attributes and implement :meth:`score`."""

    name: ClassVar[str]
    needs: ClassVar[str] = "weights"  # "weights" | "inputs" | "gradients"
    # with needs == "weights": the projections whose parameters score() reads, as attribute names of
    # the family (``"o"``, ``"ffn_out"``); None: any of the block's. A streamed run's scoring pass reads
    # only these from the checkpoint (the others are left on the meta device, where reading one fails)
    reads: ClassVar[tuple[str, ...] | None] = None
    gradients: ClassVar[str | None] = None  # "mask" | "weight" when needs == "gradients"
    # how ``allocation: global`` spends the budget: one threshold over all units, or (Kwon et al.)
    # a search maximising the kept Fisher importance
    global_search: ClassVar[str] = "threshold"
    # with needs == "inputs": also the inputs' Gram statistics (one layer's at a time: the dense model
    # is then run block by block, in memory too)
    second_order: ClassVar[bool] = False

    @property
    def options(self) -> type[CriterionOptions]:
        return CRITERION_OPTIONS[self.name]

    def gradient_flag(self, opts: Any) -> bool:
        """Mask gradients: keep per-sample rows; weight gradients: also second-order terms."""
        return False

    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts: Any, data: Any = None) -> Scores:
        raise NotImplementedError

    def finalize(self, scores: list[Scores], opts: Any) -> list[Scores]:
        """Whole-model post-processing of the per-layer scores (default: none)."""
        return scores


REGISTRY: dict[str, Criterion] = {}


def register(cls: type[Criterion]) -> type[Criterion]:
    if cls.name not in CRITERION_OPTIONS:
        raise ValueError(f"criterion {cls.name!r} has no options schema in core.spec.criteria")
    REGISTRY[cls.name] = cls()
    return cls


def needs_data(data: Any, name: str) -> Any:
    if data is None:
        raise ValueError(f"the {name} criterion needs calibration data (none was collected)")
    return data
