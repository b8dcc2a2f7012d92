"""Streaming second-order statistics of a linear layer's input.

Following the accumulator shape of SparseGPT/GPTQ (``add_batch`` → solve → ``free``), but for the
affine problems of the paper we keep three sufficient statistics of the input X (n_tokens, C_in):

    G = XᵀX  (C_in, C_in)     s = Xᵀ1  (C_in,)     n = number of tokens

Padding tokens are excluded through a boolean token mask. X itself is never stored beyond a bounded
buffer: batches are gathered until ``FLUSH_TOKENS`` tokens (or ``FLUSH_BYTES``) and then multiplied
in one product, whose float32 result is added to float64 running totals — long streams do not lose
precision however many batches they have, and fewer, larger products run closer to the hardware's
peak than one small product per batch. On a CPU a product of ``FLUSH_TOKENS_CPU`` tokens already
runs at the rate of larger ones, while gathering batches into one buffer costs a copy of them
(measured on 2 cores: 4 products of 2048 × 1536 inputs 124 ms, gathered into one 135 ms).

Precision of each product (``dtype``): float32 (default) or float64. Inputs in bfloat16 / float16
(the model's own activations on a GPU) are multiplied on tensor cores with float32 accumulation —
either bf16/fp16 products with a float32 output, or TF32 after casting to float32. Both are exact
at the inputs, since bfloat16 and float16 values are exactly representable in TF32 (8 and 10 mantissa
bits against its 10); only the order of the float32 accumulation differs from a plain float32 GEMM.
Float32 inputs never use TF32 (it would drop 13 mantissa bits). On a CPU, float32 products go
through oneDNN where ``core/kernels/cpu_matmul.py`` chose it (2× the BLAS's rate on some CPUs).

On a CPU whose products go through the BLAS, each flush's float32 product is accumulated by the GEMM
itself into float32 block rows (``addmm_``, the add fused into the product's write-back), and those are
added to the float64 totals every ``FOLD_TOKENS`` tokens: the float32 sums then span as many tokens as
one GPU product does (``FLUSH_TOKENS``), and the separate float64 add of every 2,048-token product —
about a third of the Gram's time at 1,536 channels on 2 cores — is paid once per fold.

G is symmetric, so each product covers only its upper block triangle (column blocks of at least
``MIN_BLOCK`` channels, at most ``MAX_BLOCKS`` of them: 6 blocks for 1536 channels do 58% of the
products of the full ``XᵀX``), and the lower triangle is mirrored from it when ``gram`` is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from core.kernels import cpu_matmul

MIN_BLOCK = 256
MAX_BLOCKS = 8
FLUSH_TOKENS = 8192  # tokens gathered before one product
FLUSH_TOKENS_CPU = 2048  # on a CPU a 2048-token product runs at the rate of a larger one, and gathering costs
FLUSH_BYTES = 512 * 2**20  # ... or this many bytes of buffered inputs
FOLD_TOKENS = FLUSH_TOKENS  # CPU (BLAS): tokens summed in float32 block rows before the float64 add
_HALF = (torch.bfloat16, torch.float16)


def _edges(c: int) -> list[int]:
    k = max(1, min(MAX_BLOCKS, c // MIN_BLOCK))
    return [c * i // k for i in range(k + 1)]


def flush_tokens(x: torch.Tensor) -> int:
    """Tokens to gather before one product, for inputs on ``x``'s device."""
    return FLUSH_TOKENS if x.is_cuda else FLUSH_TOKENS_CPU


@contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """CUDA float32 matrix products with (or without) TF32 inside the block; the setting is restored."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


_mm_out_dtype = True  # whether torch.mm(..., out_dtype=float32) works here; found out on first use


def gram_product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``aᵀ b`` in ``dtype`` (float32 or float64) with the precision rules of the module docstring."""
    global _mm_out_dtype
    if cpu_matmul.takes(a, dtype):
        return cpu_matmul.gram_tn(a, b)
    if dtype == torch.float32 and a.is_cuda and a.dtype in _HALF:
        if _mm_out_dtype:
            try:  # bf16/fp16 tensor cores writing a float32 result
                return torch.mm(a.T, b, out_dtype=torch.float32)
            except (RuntimeError, TypeError):  # older torch: TF32 on the exact float32 copies from now on
                _mm_out_dtype = False
        with tf32(True):
            return a.float().T @ b.float()
    a, b = a.to(dtype), b.to(dtype)
    with tf32(False):  # TF32 would drop mantissa bits of float32 inputs
        return a.T @ b


def _accumulates(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a flush of ``x`` accumulates in float32 block rows: float32 products on a CPU through
    the BLAS (oneDNN's route sums its own chunks; a GPU product already spans ``FLUSH_TOKENS``)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and dtype == torch.float32 and not cpu_matmul.takes(x)


def _upper_blocks(x: torch.Tensor, edges: list[int], dtype: torch.dtype) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(a, b, x[:, a:b]ᵀ x[:, a:])`` for each block row ``[a, b)`` of ``XᵀX``'s upper triangle."""
    rows = list(zip(edges[:-1], edges[1:]))
    if cpu_matmul.takes(x, dtype):
        yield from ((a, b, p) for (a, b), p in zip(rows, cpu_matmul.gram_tn(x, rows=rows)))
        return
    for a, b in rows:
        yield a, b, gram_product(x[:, a:b], x[:, a:], dtype)


class InputStats:
    """Accumulates ``G``, ``s`` and ``n`` over batches of inputs ``(..., C_in)``."""

    def __init__(self, c_in: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"statistics must be accumulated in float32 or float64, not {dtype}")
        self.c_in = c_in
        self.dtype = dtype  # precision of each product; totals are float64
        self._gram = torch.zeros(c_in, c_in, dtype=torch.float64, device=device)  # upper blocks are current
        self._mirrored = True  # whether the lower triangle matches the upper one
        self._edges = _edges(c_in)
        self._rows = list(zip(self._edges[:-1], self._edges[1:]))  # the upper triangle's block rows
        self._sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self._buffer: list[torch.Tensor] = []
        self._buffered = 0  # tokens in the buffer
        self._acc: list[torch.Tensor] | None = None  # CPU (BLAS): float32 upper block rows not yet folded
        self._acc_tokens = 0
        self.count = 0

    def _flush(self) -> None:
        if not self._buffer:
            return
        x = self._buffer[0] if len(self._buffer) == 1 else torch.cat(self._buffer)
        self._buffer, self._buffered = [], 0
        if _accumulates(x, self.dtype):
            self._accumulate(x)
        else:
            for a, b, product in _upper_blocks(x, self._edges, self.dtype):
                self._gram[a:b, a:] += product
        self._mirrored = False
        # summed in the product's precision (float32: pairwise, no float64 copy of the buffer), then
        # added to the float64 total like the Gram
        self._sum += x.sum(0, dtype=self.dtype)

    def _accumulate(self, x: torch.Tensor) -> None:
        """``x``'s upper block products added into the float32 block rows by the GEMM; folded into the
        float64 Gram every ``FOLD_TOKENS`` tokens (module docstring)."""
        if self._acc is None:
            self._acc = [torch.zeros(b - a, self.c_in - a, dtype=x.dtype) for a, b in self._rows]
        for (a, b), acc in zip(self._rows, self._acc):
            acc.addmm_(x[:, a:b].T, x[:, a:])
        self._acc_tokens += x.shape[0]
        if self._acc_tokens >= FOLD_TOKENS:
            self._fold()

    def _fold(self) -> None:
        if self._acc is None or not self._acc_tokens:
            return
        for (a, b), acc in zip(self._rows, self._acc):
            self._gram[a:b, a:] += acc
            acc.zero_()
        self._acc_tokens = 0

    @property
    def gram(self) -> torch.Tensor | None:
        """``XᵀX`` (float64, exactly symmetric)."""
        self._flush()
        self._fold()
        self._acc = None  # read once every batch is in: its memory goes before the solve's
        if self._gram is not None and not self._mirrored:
            g, e = self._gram, self._edges
            for a, b in zip(e[:-1], e[1:]):
                g[b:, a:b] = g[a:b, b:].T
                d = g[a:b, a:b]
                d.copy_(torch.triu(d) + torch.triu(d, 1).T)
            self._mirrored = True
        return self._gram

    @property
    def sum(self) -> torch.Tensor | None:
        """``Xᵀ1`` (float64)."""
        self._flush()
        return self._sum

    @torch.no_grad()
    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add inputs ``x`` of shape ``(..., C_in)``; ``mask`` of shape ``x.shape[:-1]`` marks real tokens."""
        if x.shape[-1] != self.c_in:
            raise ValueError(f"expected {self.c_in} input channels, got {x.shape[-1]}")
        x = x.reshape(-1, self.c_in)
        if mask is not None:
            x = x[mask.reshape(-1).to(x.device)]
        x = x.detach().to(device=self._gram.device)
        if not (x.is_cuda and x.dtype in _HALF and self.dtype == torch.float32):
            x = x.to(self.dtype)  # CPU, float32 inputs or float64 products: multiply in ``dtype``
        self._buffer.append(x)
        self._buffered += x.shape[0]
        self.count += x.shape[0]
        if self._buffered >= flush_tokens(x) or self._buffered * self.c_in * x.element_size() >= FLUSH_BYTES:
            self._flush()

    @classmethod
    def from_tensor(cls, x: torch.Tensor, dtype: torch.dtype = torch.float64) -> InputStats:
        stats = cls(x.shape[-1], dtype=dtype, device=x.device)
        stats.add_batch(x)
        return stats

    @property
    def mean(self) -> torch.Tensor:
        if self.count == 0:
            raise ValueError("no tokens were accumulated")
        return self.sum / self.count

    def free(self) -> None:
        self._gram = self._sum = self._acc = None
        self._buffer = []


class ChannelStats:
    """Per-channel count, sum and sum of squares of a projection's input, streamed in float64."""

    def __init__(self, c_in: int, device="cpu"):
        self.count = 0
        self.sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self.sumsq = torch.zeros(c_in, dtype=torch.float64, device=device)

    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        x = x.reshape(-1, x.shape[-1])
        if mask is not None:
            x = x[mask.reshape(-1).to(x.device)]
        x = x.to(torch.float64)
        self.count += x.shape[0]
        self.sum += x.sum(0)
        self.sumsq += (x * x).sum(0)

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / self.count

    @property
    def variance(self) -> torch.Tensor:
        """Unbiased sample variance (n − 1)."""
        return ((self.sumsq - self.count * self.mean**2) / max(self.count - 1, 1)).clamp_min(0)

    @property
    def mean_square(self) -> torch.Tensor:
        return self.sumsq / self.count


class OutputGain:
    """The squared gain of a norm applied to a projection's output, per output channel: ``Σ z² / Σ y²``
    over the calibration tokens (``y`` the norm's input, ``z`` its output), streamed in float64. An
    error ``δy`` in channel ``i`` of the projection's output reaches the norm's output about
    ``gain[i]`` times as large in energy (an RMSNorm's ``γ_i² / rms(y)²``, averaged over the tokens
    with weights ``y_i²``; the norm's own projection off ``y`` neglected)."""

    def __init__(self, c_out: int, device="cpu"):
        self.inputs = ChannelStats(c_out, device)
        self.outputs = ChannelStats(c_out, device)

    def add_batch(self, y: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self.inputs.add_batch(y, mask)
        self.outputs.add_batch(z, mask)

    @property
    def squared(self) -> torch.Tensor:
        """Per channel; 1 where the input never moved (its gain is then unobserved and irrelevant)."""
        y, z = self.inputs.sumsq, self.outputs.sumsq
        return torch.where(y > 0, z / y.clamp_min(torch.finfo(y.dtype).tiny), torch.ones_like(y))


def in_residual_units(weight: torch.Tensor, gain: OutputGain | None) -> torch.Tensor:
    """``weight`` with each output row scaled by the gain of the norm its output passes before the
    residual stream, so that output errors computed from it are the residual's; as is without one."""
    if gain is None:
        return weight
    return weight * gain.squared.sqrt().to(weight.device, weight.dtype)[:, None]
