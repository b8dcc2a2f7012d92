"""``obs``: units scored by the output error their removal leaves once the rest is refitted, comparable
across layers — a gradient-free, streamable non-uniform allocation.

On the dense model, each layer's greedy OBS paths (:func:`core.stats.select.obs_curve`: the
structured optimal-brain-surgeon removal that ``select: obs`` and ``head_ratio: obs`` use) of o_proj
(heads) and of the FFN's output projection (neurons) give the summed squared output error after each
removal, with the rest refitted. A unit's score is its marginal error along its path — the rise of
the round that removed it per unit, made non-decreasing so that a layer always loses a prefix of its
path — divided (``normalize: residual``, the default) by the mean squared norm of the residual stream
entering the block: the error a block adds is read against the signal it is added to, which grows
with depth. Where the family normalises the attention's and the FFN's outputs before they join the
residual stream (Gemma's sandwich norms), each output row's errors are weighted by the squared gain
of that norm measured on the calibration data (:class:`core.stats.accumulate.OutputGain`), so that
all errors are the residual stream's. ``allocation: global`` then ranks all units of all layers by
score per parameter removed. Units past ``max_layer_ratio`` of their layer's heads or neurons are
never reached by the path and score +inf; with ``over_cap: last`` the path runs on and they are
marked instead, for the allocation to take only after every unit within every layer's cap (the
default's cap: a ratio stays reachable whatever the model's head counts).

Measured on SmolLM2-135M (``docs/results/obs_allocation.md``): best of every recipe at 20% (31.1
against 40.2 for the uniform default, also on unseen text); at 50% without a cap it cuts half the
layers to a twentieth and fails (238.6), with ``max_layer_ratio: 0.75`` 120.5. The curves are taken
on the dense model, one layer at a time: a heavily cut layer feeds the next ones inputs their curves
never saw, which the summed local errors do not predict.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.criteria.base import Criterion, Scores, needs_data, register
from core.models.adapter import Adapter
from core.stats.accumulate import in_residual_units
from core.stats.select import Curve, obs_curve

DAMP = 1e-3  # as the ls refit's default


def marginal_scores(curve: Curve, n_units: int, scale: float = 1.0) -> torch.Tensor:
    """Each unit's marginal error along a greedy path (non-decreasing along it) over ``scale``; units
    the path does not reach score +inf."""
    out = torch.full((n_units,), math.inf, dtype=torch.float64)
    best = 0.0
    for j in range(1, len(curve.removed)):
        lo, hi = curve.removed[j - 1], curve.removed[j]
        best = max((curve.error[j] - curve.error[j - 1]) / (hi - lo), best)
        out[curve.order[lo:hi]] = best / scale
    return out


AUTO_STEP, AUTO_MAX_ROUNDS = 32, 64  # ``step: auto``: 32 neurons a round, at most 64 rounds a path


def path_step(step: int | str, n_neurons: int) -> int:
    """Neurons a round of an FFN's path removes: ``step``, or for ``auto`` 32 — the step every
    measured default ran with (SmolLM2's 1,536 and Gemma 3 270M's 2,048 neurons: 48 and 64 rounds) —
    raised for wider FFNs so that a path takes at most 64 rounds (LLaMA-7B's 11,008 neurons: 172 a
    round, not 344 rounds of 32). Each round is a handful of small GPU operations and reads of the
    device; coarser rounds cost little quality: SmolLM2 with 12-round paths (step 128) was within 1% of
    48-round paths at 20% and 50% (31.42 vs 31.13 and 101.96 vs 101.32 on Wikipedia, 103.98 vs 104.67
    and 320.77 vs 323.92 on Rotten Tomatoes; 2026-11-26)."""
    if step != "auto":
        return int(step)
    return max(AUTO_STEP, math.ceil(n_neurons / AUTO_MAX_ROUNDS))


def path_length(n_units: int, cap: float | None) -> int:
    """Units a layer's path removes: all but one, or at most ``cap`` of them."""
    return n_units - 1 if cap is None else min(n_units - 1, math.floor(cap * n_units))


def past_cap(curve: Curve, n_units: int, cap: float) -> torch.Tensor:
    """The units a (full) path removes after the first ``cap`` of the layer's units."""
    over = torch.zeros(n_units, dtype=torch.bool)
    over[curve.order[path_length(n_units, cap) :]] = True
    return over


@register
class Obs(Criterion):
    name = "obs"
    needs = "inputs"
    second_order = True

    @torch.no_grad()
    def score(self, layer: nn.Module, adapter: Adapter, layer_idx: int, opts, data=None) -> Scores:
        inputs = needs_data(data, "obs")
        fam = adapter.family
        scale = 1.0
        if opts.normalize == "residual":
            r = inputs.residual
            scale = float(r.sumsq.sum() / r.count)
        cap = opts.max_layer_ratio
        soft = cap is not None and opts.over_cap == "last"  # the whole path, units past the cap marked
        walk = None if soft else cap
        heads = obs_curve(
            in_residual_units(layer.get_submodule(fam.o).weight, inputs.attn_gain),
            inputs.attn_gram,
            path_length(adapter.n_heads, walk),
            adapter.head_dim,
            DAMP,
            release=True,
        )
        neurons = obs_curve(
            in_residual_units(layer.get_submodule(fam.ffn_out).weight, inputs.ffn_gain),
            inputs.ffn_gram,
            path_length(adapter.n_neurons, walk),
            1,
            DAMP,
            step=path_step(opts.step, adapter.n_neurons),
            release=True,
        )
        return Scores(
            heads=marginal_scores(heads, adapter.n_heads, scale),
            neurons=marginal_scores(neurons, adapter.n_neurons, scale),
            over_cap_heads=past_cap(heads, adapter.n_heads, cap) if soft else None,
            over_cap_neurons=past_cap(neurons, adapter.n_neurons, cap) if soft else None,
        )
