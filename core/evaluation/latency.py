"""A latency table for a speed target: what one block costs at candidate widths, and what the rest of
the model costs, measured on the device that will serve the model.

Speed does not depend on the weights, so the table is measured on skeletons: the model's own config
with ``k`` blocks, random weights in the model's dtype on its device, every block pruned uniformly to
the candidate width (query heads and FFN neurons removed in the default recipe's split: heads take
half the block's ratio, neurons the rest). Timing each width with ``k1`` and ``k2`` blocks separates
a block's cost from the fixed cost (embeddings, final norm, output head, the framework's per-call
work): ``t(k) = fixed + k × block``. The model with ``d`` blocks removed and the rest at width ``w``
is then predicted to take ``fixed(w) + (L − d) × block(w)``, interpolated linearly between widths.

Workloads: ``decode_b1`` — milliseconds per token of batch-1 greedy decoding
(:func:`core.evaluation.speed.decode_ms_per_token`); ``prefill_b8x512`` — one forward over 8 × 512
tokens.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch
from torch import nn

from core.evaluation.speed import decode_ms_per_token, prefill_tokens_per_second
from core.models.adapter import adapter_for, unit_costs
from core.models.modeling_liar import prune_layer_
from core.spec.depth import SPEED_WORKLOADS

WORKLOADS = SPEED_WORKLOADS  # the recipe's target.workload choices
K = TypeVar("K")
WIDTHS = (0.0, 0.2, 0.35, 0.5, 0.65)  # fractions of each block's parameters removed


@dataclass
class LatencyTable:
    """Seconds of one workload call: ``fixed[i] + blocks × per_block[i]`` at width ``widths[i]``."""

    workload: str
    layers: int  # the model's blocks
    widths: list[float]
    fixed: list[float]
    per_block: list[float]
    device: str

    def _at(self, values: list[float], width: float) -> float:
        w = self.widths
        if not w[0] <= width <= w[-1]:
            raise ValueError(f"width {width:g} lies outside the table's {w[0]:g}–{w[-1]:g}")
        i = max(j for j in range(len(w)) if w[j] <= width)
        if i == len(w) - 1:
            return values[i]
        f = (width - w[i]) / (w[i + 1] - w[i])
        return values[i] + f * (values[i + 1] - values[i])

    def seconds(self, removed: int, width: float) -> float:
        """Predicted time of the model with ``removed`` blocks gone and the others at ``width``."""
        return self._at(self.fixed, width) + (self.layers - removed) * self._at(self.per_block, width)

    def speedup(self, removed: int, width: float) -> float:
        return self.seconds(0, 0.0) / self.seconds(removed, width)

    def width_for(self, speedup: float, removed: int) -> float | None:
        """The least width ratio (to 0.001) that reaches ``speedup`` with ``removed`` blocks gone, or None
        when the table's widest ratio does not."""
        if self.speedup(removed, self.widths[-1]) < speedup:
            return None
        lo, hi = 0.0, self.widths[-1]
        if self.speedup(removed, lo) >= speedup:
            return 0.0
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.speedup(removed, mid) >= speedup else (mid, hi)
        return hi

    def to_dict(self) -> dict:
        return asdict(self)


def skeleton(model: nn.Module, blocks: int, width: float) -> nn.Module:
    """A random model of ``model``'s config with ``blocks`` blocks, each pruned uniformly by ``width``
    (see the module docstring), in its dtype on its device."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    for key in ("layer_types", "liar_layout"):
        if isinstance(getattr(cfg, key, None), list):
            setattr(cfg, key, getattr(cfg, key)[:blocks])
    cfg.num_hidden_layers = blocks
    param = next(model.parameters())
    with torch.device(param.device):
        sk = AutoModelForCausalLM.from_config(cfg, dtype=param.dtype).eval()
    if width > 0:
        adapter = adapter_for(sk)
        layer = adapter.layers(sk)[0]
        costs = unit_costs(layer, adapter)
        total = sum(p.numel() for p in layer.parameters())
        rep = adapter.n_heads // adapter.n_kv_heads
        heads = max(1, round(adapter.n_heads * (1 - width / 2)))
        kv = -(-heads // rep) if adapter.family.gqa else heads
        removed = (adapter.n_heads - heads) * costs["head"] + (adapter.n_kv_heads - kv) * costs["kv"]
        left = max(width * total - removed, 0)
        neurons = max(1, adapter.n_neurons - round(left / costs["neuron"]))
        for layer in adapter.layers(sk):
            prune_layer_(layer, adapter.family, sk.config, list(range(heads)), list(range(kv)), neurons)
    return sk


def time_workload(model: nn.Module, workload: str) -> float:
    """Seconds of one call of ``workload`` on ``model`` (see the module docstring)."""
    if workload == "decode_b1":
        return decode_ms_per_token(model, new=16) / 1000
    return 8 * 512 / prefill_tokens_per_second(model, batch=8, seq_len=512, repeats=1)


@torch.no_grad()
def interleaved_seconds(models: dict[K, nn.Module], workload: str, rounds: int) -> dict[K, list[float]]:
    """Seconds of ``workload`` on each model, ``rounds`` samples each, in rounds that interleave the
    models (a slow stretch of the machine falls on all alike) after one untimed warm-up round."""
    samples: dict[K, list[float]] = {key: [] for key in models}
    for r in range(rounds + 1):
        for key, m in models.items():
            t = time_workload(m, workload)
            if r:
                samples[key].append(t)
    return samples


@torch.no_grad()
def measure_table(model: nn.Module, workload: str, widths: tuple[float, ...] = WIDTHS, rounds: int = 3) -> LatencyTable:
    """The latency table of ``model`` for ``workload`` on the model's device (see the module docstring):
    skeletons of 1 and ``max(2, L // 2)`` blocks at every width (:func:`interleaved_seconds`), each cell
    the median."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    layers = int(model.config.num_hidden_layers)
    k1, k2 = 1, max(2, layers // 2)
    samples = interleaved_seconds({(w, k): skeleton(model, k, w) for w in widths for k in (k1, k2)}, workload, rounds)
    fixed, per_block = [], []
    for w in widths:
        t1, t2 = (statistics.median(samples[(w, k)]) for k in (k1, k2))
        block = max((t2 - t1) / (k2 - k1), 1e-9)
        per_block.append(block)
        fixed.append(max(t1 - k1 * block, 0.0))
    device = str(next(model.parameters()).device)
    return LatencyTable(workload, layers, list(widths), fixed, per_block, device)
