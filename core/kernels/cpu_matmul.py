"""Float32 matrix products on a CPU through oneDNN's kernels instead of the BLAS torch calls.

torch multiplies float32 CPU matrices with the BLAS it was built with (MKL in the official wheels).
MKL picks its kernels by the CPU's vendor: on an AMD EPYC with AVX-512 it runs AVX2 code at
≈ 190 GFLOP/s on 2 cores, while oneDNN — the other library in the same wheel, whose JIT kernels
are chosen by the instruction set alone — runs the same float32 products at 400–480 GFLOP/s
(``docs/results/cpu_matmul.md``). The engine's work on a CPU is almost all such products (the
model's own projections, the replays of pruned projections, the Gram statistics), so while a prune
or an evaluation runs on the CPU, :func:`fast_linear` sends every ``nn.Linear`` to oneDNN, and the
Gram accumulator calls :func:`gram_tn` directly.

The results are float32 products with float32 accumulation either way (no reduced-precision math:
oneDNN's default ``fpmath`` mode is strict); only the order of the sums differs, as between two BLAS
libraries. Its float32 sums run sequentially along the reduced dimension, so products over tokens
(Gram statistics) are taken in chunks of ``REDUCE_CHUNK`` tokens, which keeps their error at the
BLAS's. oneDNN runs a column-strided input or a non-contiguous weight through a slow reference path
(seconds for one product), so such calls stay with the BLAS.

``LIAR_CPU_MATMUL`` chooses: ``auto`` (default) uses oneDNN where this torch has it and a one-time
check on this machine agrees with the BLAS product; ``onednn`` the same; ``blas`` never uses it.
The choice holds for the process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

ENV = "LIAR_CPU_MATMUL"
CHOICES = ("auto", "onednn", "blas")
_CHECK_TOLERANCE = 1e-5  # relative, against a float64 product; float32 rounding is ~1e-7
# Products smaller than this many multiply-adds stay with the BLAS: oneDNN spends ~10 µs more a call
# and compiles a kernel for each new shape (0.5–50 ms), which a small product never earns back (a
# 128 × 576 × 576 product is already 2× faster through oneDNN; a decoding step's 1 × 576 × 576 is not)
MIN_MACS = 2**24
# oneDNN sums a float32 product's k terms one after another (its error grows with k: 3.3e-7 relative
# for a 2048-token Gram where the BLAS's is 8e-8), so products over tokens run in chunks of this many
# tokens whose partial products are summed: 9.5e-8, as fast (docs/results/cpu_matmul.md)
REDUCE_CHUNK = 256


def _onednn_op():
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return getattr(mkldnn, "_linear_pointwise", None) if mkldnn is not None else None


@cache
def backend() -> str:
    """``"onednn"`` or ``"blas"``: which library this process multiplies float32 CPU matrices with."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "blas" or not torch.backends.mkldnn.is_available() or _onednn_op() is None:
        return "blas"
    return "onednn" if _agrees() else "blas"


def _agrees() -> bool:
    """One small product with a bias, compared with float64: the op exists, runs and is exact."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g) for shape in ((3, 40, 72), (56, 72), (56,)))
    try:
        y = _onednn_op()(x, w, b, "none", [], "")
    except RuntimeError:
        return False
    ref = F.linear(x.double(), w.double(), b.double())
    return y.shape == ref.shape and bool((y.double() - ref).norm() <= _CHECK_TOLERANCE * ref.norm())


def _unit_stride(t: torch.Tensor) -> bool:
    return t.dim() >= 1 and t.stride(-1) == 1 and t.numel() > 0


def takes(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    """Whether products of ``x`` (a CPU tensor) in ``dtype`` go to oneDNN in this process."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and dtype == torch.float32 and backend() == "onednn"


def _chunks_t(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """``(C, ≤ REDUCE_CHUNK)`` contiguous transposes of consecutive row (token) chunks of ``x``; the
    whole chunks in one batched copy (3× faster than one transpose a chunk at 1,536 channels)."""
    n, whole = x.shape[0], x.shape[0] // REDUCE_CHUNK * REDUCE_CHUNK
    if whole:
        yield from x[:whole].reshape(-1, REDUCE_CHUNK, x.shape[1]).transpose(1, 2).contiguous().unbind(0)
    if whole < n:
        yield x[whole:].T.contiguous()


def gram_tn(a: torch.Tensor, b: torch.Tensor | None = None, rows: list[tuple[int, int]] | None = None):
    """Products over the token dimension of float32 CPU matrices ``a``, ``b`` of shape ``(n, C)``:
    ``[a[:, r0:r1]ᵀ b[:, r0:] for (r0, r1) in rows]`` (the block rows of a Gram's upper triangle;
    ``b`` None: ``a``), or ``aᵀb`` when ``rows`` is None. Through oneDNN when :func:`takes` says so
    and the product has ``MIN_MACS`` multiply-adds: the tokens in chunks of ``REDUCE_CHUNK``, whose
    float32 partial products are summed; else torch's products."""
    same = b is None
    b = a if same else b
    blocks = rows or [(0, a.shape[1])]
    full = rows is None
    if not (takes(a) and b.dtype == torch.float32 and a.shape[0] * a.shape[1] * b.shape[1] >= MIN_MACS):
        out = [a[:, r0:r1].T @ (b if full else b[:, r0:]) for r0, r1 in blocks]
        return out[0] if full else out
    op = _onednn_op()
    sums: list[torch.Tensor | None] = [None] * len(blocks)
    # one transposed copy of each chunk when the product is a Gram (b is a)
    chunks = ((at, at) for at in _chunks_t(a)) if same else zip(_chunks_t(a), _chunks_t(b))
    for at, bt in chunks:
        for i, (r0, r1) in enumerate(blocks):
            part = op(at[r0:r1], bt if full else bt[r0:], None, "none", [], "")
            sums[i] = part if sums[i] is None else sums[i].add_(part)
    return sums[0] if full else sums


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` through oneDNN where it can take the call (float32 CPU operands, the input of
    unit stride along its channels and at least 2-D, a contiguous weight, nothing needing gradients,
    ``MIN_MACS`` multiply-adds at least), else ``F.linear``."""
    if _eligible(x, weight, bias):
        return _onednn_op()(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _eligible(x, weight, bias) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if x.dim() < 2 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        return False
    if x.numel() * weight.shape[0] < MIN_MACS:
        return False
    if not (takes(x) and weight.dtype == torch.float32 and weight.device.type == "cpu"):
        return False
    if bias is not None and (bias.dtype != torch.float32 or bias.dim() != 1 or not bias.is_contiguous()):
        return False
    if not weight.is_contiguous():  # a window of a wider weight runs oneDNN's reference path (seconds)
        return False
    needs_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        return False  # oneDNN's op has no backward
    return _unit_stride(x)


_local = threading.local()  # per thread: a prune in a worker thread leaves the other threads' layers alone
_lock = threading.Lock()
_users = 0  # threads inside fast_linear: the class's forward is routed while there are any
_stock_forward = nn.Linear.forward


def _routed_forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    if getattr(_local, "active", False) and not getattr(_local, "suspended", False):
        return linear(input, self.weight, self.bias)
    return _stock_forward(self, input)


@contextmanager
def fast_linear(device: torch.device | str | None = "cpu") -> Iterator[None]:
    """Inside, every ``nn.Linear`` this thread runs on float32 CPU tensors multiplies through oneDNN
    when :func:`backend` chose it (other threads keep torch's own forward). ``nn.Linear.forward`` is
    routed only while some thread is inside — a one-attribute check a call, where intercepting every
    torch function (a ``TorchFunctionMode``) cost 5% of a CPU prune — and is torch's own again after.
    A no-op for another ``device``, when the BLAS was chosen, and when already inside."""
    global _users
    if torch.device(device).type != "cpu" or backend() != "onednn" or getattr(_local, "active", False):
        yield
        return
    with _lock:
        if _users == 0:
            nn.Linear.forward = _routed_forward
        _users += 1
    _local.active = True
    try:
        yield
    finally:
        _local.active = False
        with _lock:
            _users -= 1
            if _users == 0:
                nn.Linear.forward = _stock_forward


@contextmanager
def stock_linear() -> Iterator[None]:
    """Inside, this thread's ``nn.Linear`` runs torch's own forward again (a speed measurement that
    must time what a user's stock model runs)."""
    before = getattr(_local, "suspended", False)
    _local.suspended = True
    try:
        yield
    finally:
        _local.suspended = before
