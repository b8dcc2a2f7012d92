"""What a run's matrix products cost, and what they should take on this CPU.

:class:`ProductCounter` counts the multiply-adds of every matrix product torch dispatches while it is
active (``mm``, ``addmm`` and ``addmm_``, ``bmm``, ``baddbmm``, oneDNN's linear, and the CPU's fused attention), by
operator; :func:`gemm_rate` times a square float32 product through the same route the engine uses for
its projections (oneDNN or the BLAS, whichever this process chose). A prune's time set against
``2 · multiply-adds / rate`` says how far the engine is from the machine: 1.0 would be a run that
does nothing but its products, each at the rate of a large square one.

The count runs on a separate, untimed pass (dispatching every operator through Python is slower);
the products a run does do not depend on which library multiplies them. A counter made with
``shapes=True`` also keeps each distinct product (operator, operand shapes, strides and dtype) and how
often it ran; :meth:`ProductCounter.replayed_seconds` then times each of them alone on random operands
of the same layout: what the run's products take on this CPU at their own shapes, where a small
product runs below the square product's rate.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from math import prod
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import best_time

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


def _layout(value: Any) -> Any:
    """A product's argument as what replaying it needs: a tensor's (shape, stride, dtype), anything
    else as it is (hashable, so equal products share one key)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:  # e.g. oneDNN's packed weight: no strides to replay
            return ("opaque", tuple(value.shape), value.dtype)
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_layout(v) for v in value)
    return value


def _operand(spec: Any, g: torch.Generator) -> Any:
    if isinstance(spec, tuple) and spec and spec[0] == "opaque":
        raise RuntimeError(f"an operand of layout other than strided ({spec[1]})")
    if isinstance(spec, tuple) and spec and spec[0] == "tensor":
        _, shape, stride, dtype = spec  # storage filled first: strides may overlap (an expanded operand)
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True)) if all(shape) else 0
        storage = torch.empty(size, dtype=dtype)
        storage = storage.normal_(generator=g) if storage.is_floating_point() else storage.zero_()
        return storage.as_strided(shape, stride)
    if isinstance(spec, tuple):
        return tuple(_operand(v, g) for v in spec)
    return spec


class ProductCounter(TorchDispatchMode):
    """``with ProductCounter() as c: ...`` then ``c.macs`` (total) and ``c.by_op`` (per operator);
    with ``shapes=True`` also ``c.replayed_seconds()`` (module docstring)."""

    def __init__(self, shapes: bool = False) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.shapes = shapes
        self.calls: Counter[tuple] = Counter()  # (operator, argument layouts, keyword layouts) → how often
        self._ops: dict[tuple, tuple[Any, int]] = {}  # the same key → (operator, multiply-adds of one call)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        macs = _macs(func, args)
        if macs:
            self.by_op[str(func.overloadpacket)] += macs
            if self.shapes:
                key = (str(func), _layout(args), _layout(tuple(sorted((kwargs or {}).items()))))
                self.calls[key] += 1
                self._ops.setdefault(key, (func, macs))
        return func(*args, **(kwargs or {}))

    @property
    def macs(self) -> int:
        return sum(self.by_op.values())

    def replayed_seconds(self, repeats: int = 3) -> tuple[float, int]:
        """``(seconds, products)``: every distinct product timed alone on random operands of its own
        layout (the best of ``repeats`` after a warm-up), times how often the run made it; and how many
        distinct products there were. An operand torch cannot allocate as a plain strided tensor (a
        library's packed weight) fails the replay with a ``ValueError``."""
        g = torch.Generator().manual_seed(0)
        total = 0.0
        for key, count in self.calls.items():
            func, _ = self._ops[key]
            _, args_spec, kwargs_spec = key
            try:
                args, kwargs = _operand(args_spec, g), dict(_operand(kwargs_spec, g))
            except RuntimeError as exc:
                raise ValueError(f"cannot replay {key[0]} on plain tensors: {exc}") from None
            with torch.no_grad():
                total += count * best_time(partial(func, *args, **kwargs), repeats)
        return total, len(self.calls)


def gemm_rate(multiply, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of ``multiply(x, w)`` (``F.linear``'s convention: ``x @ wᵀ``) on float32 ``n × n``
    operands: the best of ``repeats`` timings after one warm-up."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    return 2 * n**3 / best_time(partial(multiply, x, w), repeats) / 1e9
