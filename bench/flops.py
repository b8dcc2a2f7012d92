"""What a run's matrix products cost, and what they should take on this CPU.

:class:`ProductCounter` counts the multiply-adds of every matrix product torch dispatches while it is
active (``mm``, ``addmm`` and ``addmm_``, ``bmm``, ``baddbmm``, oneDNN's linear, and the CPU's fused attention), by
operator; :func:`gemm_rate` times a square float32 product through the same route the engine uses for
its projections (oneDNN or the BLAS, whichever this process chose). A prune's time set against
``2 · multiply-adds / rate`` says how far the engine is from the machine: 1.0 would be a run that
does nothing but its products, each at the rate of a large square one.

The count runs on a separate, untimed pass (dispatching every operator through Python is slower);
the products a run does do not depend on which library multiplies them.
"""

from __future__ import annotations

import time
from collections import Counter
from math import prod

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _macs(func, args) -> int:
    """Multiply-adds of one dispatched product, 0 for any other operator."""
    packet = func.overloadpacket
    if packet is aten.mm:
        (m, k), (_, n) = args[0].shape, args[1].shape
        return m * k * n
    if packet in (aten.addmm, aten.addmm_):  # addmm_: a product accumulated in place (core/stats)
        (m, k), (_, n) = args[1].shape, args[2].shape
        return m * k * n
    if packet is aten.bmm:
        (b, m, k), (_, _, n) = args[0].shape, args[1].shape
        return b * m * k * n
    if packet is aten.baddbmm:
        (b, m, k), (_, _, n) = args[1].shape, args[2].shape
        return b * m * k * n
    if packet is aten._scaled_dot_product_flash_attention_for_cpu:
        q, k = args[0], args[1]  # (batch, heads, L, E) and (batch, heads, S, E): QKᵀ, then the weights times V
        return 2 * prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1]
    if str(packet) == "mkldnn._linear_pointwise":
        x, w = args[0], args[1]  # (..., in) and (out, in)
        return prod(x.shape[:-1]) * w.shape[0] * w.shape[1]
    return 0


class ProductCounter(TorchDispatchMode):
    """``with ProductCounter() as c: ...`` then ``c.macs`` (total) and ``c.by_op`` (per operator)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        macs = _macs(func, args)
        if macs:
            self.by_op[str(func.overloadpacket)] += macs
        return func(*args, **(kwargs or {}))

    @property
    def macs(self) -> int:
        return sum(self.by_op.values())


def gemm_rate(multiply, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of ``multiply(x, w)`` (``F.linear``'s convention: ``x @ wᵀ``) on float32 ``n × n``
    operands: the best of ``repeats`` timings after one warm-up."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    multiply(x, w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        multiply(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9
