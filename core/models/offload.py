"""Where a run keeps the calibration activations between their uses: on the device, or in host memory.

The block loop keeps, per calibration batch, the hidden states entering the current block, the kept
input channels of the projections it replays (and their outputs once computed), and for error
feedback the dense model's states. They grow with the calibration set: 128 windows of 128 tokens
through a 70B-shaped model (hidden 8192, FFN 28672, bfloat16) are ~1 GB, 128 windows of 2048 tokens
~17 GB — beside a block's weights and its float64 statistics, more than a 24 GB card holds.

The FFN's kept inputs are the widest of them (kept neurons per token, against the hidden size for
the rest: 2.3 GB of a 7B model's 1024 samples). ``activations: recompute`` does not keep them: the
FFN's pass over the fit batches streams them into statistics only, and the block's output pass runs
the pruned FFN (norm, the kept rows of gate / up, the refitted down projection) instead of replaying
them. That costs the kept gate / up products once more (≈ 18% of a block's work, ≈ 40 ms per 7B
layer at 1024 × 128 tokens on an H100) and saves their memory.

``activations: host`` keeps the rest in pinned host memory instead: each tensor is copied to the
device when a block uses it and back when it is stored (asynchronous copies on the device's stream,
so the order of the work is kept without waiting on the host). It recomputes the FFN's inputs too:
copying them out and back (2 × 2.3 GB per 7B layer, ≥ 90 ms at PCIe 5's peak) costs more than
computing them again.

``auto`` on a CUDA device picks the first of device, recompute, host whose activations
(:func:`activation_bytes`) fit in the free device memory beside :func:`block_working_bytes`; on a
CPU the host *is* the device, and auto keeps everything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.models.adapter import Adapter


class Offload:
    """Stores per-batch activations at home (the device, or pinned host memory) and fetches them to
    the device for use. With home on the device both are the identity. ``recompute``: the block loop
    recomputes the FFN's kept inputs instead of keeping them (``activations: recompute`` and host)."""

    def __init__(self, device: torch.device | str, host: bool = False, recompute: bool = False):
        self.device = torch.device(device)
        self.host = host and self.device.type != "cpu"
        self.recompute = recompute

    @property
    def name(self) -> str:
        """What the run did, as its metrics report it: device, recompute or host."""
        return "host" if self.host else "recompute" if self.recompute else "device"

    def store(self, t: torch.Tensor) -> torch.Tensor:
        if not self.host:
            return t
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t, non_blocking=True)

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True) if self.host else t


def activation_bytes(
    adapter: Adapter, tokens: int, itemsize: int, dense: bool = False, ffn_tokens: int | None = None
) -> int:
    """An upper bound of the activations the block loop keeps for ``tokens`` calibration tokens:
    block inputs, the replayed attention and FFN outputs (in a sequential pre-norm block the
    attention's are folded into the block inputs: ``BlockRunner.absorb``), the FFN's kept inputs (at
    most all its channels) for ``ffn_tokens`` of them (all by default; with the FFN recomputed, the
    held-aside ones, whose error report reads them), and with ``dense`` (error feedback) the dense
    model's states and the dense inputs of both reconstructed projections
    (``tests/core/models/test_offload.py`` checks the bound on real runs)."""
    d, f = adapter.hidden, adapter.n_neurons
    ffn_tokens = tokens if ffn_tokens is None else ffn_tokens
    # the fold saves a hidden-size activation where the FFN pass peaks; with error feedback the dense
    # model's states and inputs peak beside them before the fold (measured by the test)
    folds = adapter.family.ffn_input_norm is not None and not dense
    per_token = (2 if folds else 3) * d + (2 * d + f if dense else 0)
    return (tokens * per_token + ffn_tokens * f) * itemsize


# C × C float64 matrices a block's solves hold at once, C its widest projection input. A refit (liar,
# ls) holds the Gram, the kept channels' block factorised in its own memory, and the right-hand side,
# the solve's intermediate and its result: 1 + k² + 3k(1 − k) ≤ 17/8 of C² for a kept share k; with
# the Gram released once the block is factorised, less (measured by the allocator at k = 0.8: 2.12
# kept, 2.00 released; ``tests/core/stats/test_reconstruct.py`` checks the bound). The OBS selection's
# inverses and working copies, and error feedback's paired statistics, are counted at three.
REFIT_MATRICES = 17 / 8
OBS_MATRICES = 3.0


def block_working_bytes(
    layer: nn.Module, adapter: Adapter, batch_tokens: int, itemsize: int, matrices: float = OBS_MATRICES
) -> int:
    """What one block's work needs besides the stored activations: its weights, one batch's
    intermediate activations in float32, and ``matrices`` float64 C × C matrices for its statistics
    and solves (0 for an evaluation; see :data:`REFIT_MATRICES`)."""
    weights = sum(p.numel() * p.element_size() for p in layer.parameters())
    batch = batch_tokens * (4 * adapter.n_neurons + 4 * adapter.hidden) * max(itemsize, 4)
    c = max(adapter.n_neurons, adapter.hidden)
    return weights + batch + int(matrices * c * c * 8)


def free_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA device, counting what torch's allocator holds but does not use."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def choose_offload(
    choice: str,
    device: torch.device,
    needed: int,
    working: int,
    free: int | None = None,
    lean: int | None = None,
) -> Offload:
    """The recipe's ``activations`` (auto | device | recompute | host) for this run. ``needed``: the
    activations kept on the device; ``lean``: the same with the FFN's inputs recomputed (None where
    nothing is recomputed: an evaluation). Auto keeps them on the device when ``needed`` fits in the
    free memory beside ``working``, recomputes when ``lean`` does, and spills to the host otherwise;
    a CPU computes where it stores (host is the device there)."""
    device = torch.device(device)
    if choice in ("device", "recompute") or device.type != "cuda":
        return Offload(device, recompute=choice in ("recompute", "host") and lean is not None)
    if choice == "host":
        return Offload(device, host=True, recompute=lean is not None)
    free = free_device_bytes(device) if free is None else free
    if needed + working <= free:
        return Offload(device)
    if lean is not None and lean + working <= free:
        return Offload(device, recompute=True)
    return Offload(device, host=True, recompute=lean is not None)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a run keeps and solves, as :func:`offload_for` sizes it: ``tokens`` calibration tokens
    (``held_tokens`` of them held aside) in batches of ``batch_tokens``; ``dense``: error feedback
    keeps the dense model's states too; ``matrices``: see :func:`block_working_bytes`."""

    tokens: int
    batch_tokens: int
    held_tokens: int = 0
    dense: bool = False
    matrices: float = OBS_MATRICES


def offload_for(choice: str, model: nn.Module, adapter: Adapter, device, work: Workload) -> Offload:
    """The run's :class:`Offload` for ``work`` (``choice``: the recipe's ``activations``); sized from
    the model's first block, whose weights may still be on the meta device (a streamed run)."""
    layer = adapter.layers(model)[0]
    itemsize = next(layer.parameters()).element_size()
    needed = activation_bytes(adapter, work.tokens, itemsize, work.dense)
    lean = activation_bytes(adapter, work.tokens, itemsize, work.dense, ffn_tokens=work.held_tokens)
    working = block_working_bytes(layer, adapter, work.batch_tokens, itemsize, work.matrices)
    return choose_offload(choice, device, needed, working, lean=lean)
