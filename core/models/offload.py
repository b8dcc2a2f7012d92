"""Where a run keeps the calibration activations between their uses: on the device, or in host memory.

The block loop keeps, per calibration batch, the hidden states entering the current block, the kept
input channels of the projections it replays (and their outputs once computed), and for error
feedback the dense model's states. They grow with the calibration set: 128 windows of 128 tokens
through a 70B-shaped model (hidden 8192, FFN 28672, bfloat16) are ~1 GB, 128 windows of 2048 tokens
~17 GB — beside a block's weights and its float64 statistics, more than a 24 GB card holds.

``activations: host`` keeps them in pinned host memory instead: each tensor is copied to the device
when a block uses it and back when it is stored (asynchronous copies on the device's stream, so the
order of the work is kept without waiting on the host). ``auto`` picks host on a CUDA device when
:func:`activation_bytes` would not fit in the free device memory beside :func:`block_working_bytes`,
the device otherwise; on a CPU the host *is* the device.
"""

from __future__ import annotations

import torch
from torch import nn

from core.models.adapter import Adapter


class Offload:
    """Stores per-batch activations at home (the device, or pinned host memory) and fetches them to
    the device for use. With home on the device both are the identity."""

    def __init__(self, device: torch.device | str, host: bool = False):
        self.device = torch.device(device)
        self.host = host and self.device.type != "cpu"

    def store(self, t: torch.Tensor) -> torch.Tensor:
        if not self.host:
            return t
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t, non_blocking=True)

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True) if self.host else t


def activation_bytes(adapter: Adapter, tokens: int, itemsize: int, dense: bool = False) -> int:
    """An upper bound of the activations the block loop keeps for ``tokens`` calibration tokens:
    block inputs, the FFN's kept inputs (at most all its channels), the replayed attention and FFN
    outputs, and with ``dense`` (error feedback) the dense model's states and the dense inputs of
    both reconstructed projections (``tests/core/test_offload.py`` checks the bound on real runs)."""
    d, f = adapter.hidden, adapter.n_neurons
    per_token = 3 * d + f + (2 * d + f if dense else 0)
    return tokens * per_token * itemsize


def block_working_bytes(
    layer: nn.Module, adapter: Adapter, batch_tokens: int, itemsize: int, statistics: bool = True
) -> int:
    """What one block's work needs besides the stored activations: its weights, one batch's
    intermediate activations in float32, and with ``statistics`` (pruning, not evaluation) the float64
    statistics of its widest projection input with the solve's copies (three C × C matrices)."""
    weights = sum(p.numel() * p.element_size() for p in layer.parameters())
    batch = batch_tokens * (4 * adapter.n_neurons + 4 * adapter.hidden) * max(itemsize, 4)
    c = max(adapter.n_neurons, adapter.hidden)
    return weights + batch + (3 * c * c * 8 if statistics else 0)


def free_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA device, counting what torch's allocator holds but does not use."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def choose_offload(choice: str, device: torch.device, needed: int, working: int, free: int | None = None) -> Offload:
    """The recipe's ``activations`` (auto | device | host) for this run: auto keeps them on the device
    when ``needed`` fits in the free memory beside ``working``, in host memory otherwise."""
    device = torch.device(device)
    if device.type != "cuda" or choice == "device":
        return Offload(device)
    if choice == "host":
        return Offload(device, host=True)
    free = free_device_bytes(device) if free is None else free
    return Offload(device, host=needed + working > free)


def offload_for(
    choice: str, model: nn.Module, adapter: Adapter, device, tokens: int, batch_tokens: int, dense: bool = False
) -> Offload:
    """The run's :class:`Offload` for ``tokens`` calibration tokens in batches of ``batch_tokens``
    (``choice``: the recipe's ``activations``); sized from the model's first block, whose weights may
    still be on the meta device (a streamed run)."""
    layer = adapter.layers(model)[0]
    itemsize = next(layer.parameters()).element_size()
    needed = activation_bytes(adapter, tokens, itemsize, dense)
    return choose_offload(choice, device, needed, block_working_bytes(layer, adapter, batch_tokens, itemsize))
