"""Streaming second-order statistics of a linear layer's input.

Following the accumulator shape of SparseGPT/GPTQ (``add_batch`` → solve → ``free``), but for the
affine problems of the paper we keep three sufficient statistics of the input X (n_tokens, C_in):

    G = XᵀX  (C_in, C_in)     s = Xᵀ1  (C_in,)     n = number of tokens

Padding tokens are excluded through a boolean token mask. X itself is never stored.
Each batch's product is computed in ``dtype`` (float32 or float64, never TF32) and added to float64
running totals, so long streams do not lose precision however many batches they have.

G is symmetric, so each batch computes only its upper block triangle (column blocks of at least
``MIN_BLOCK`` channels, at most ``MAX_BLOCKS`` of them: 6 blocks for 1536 channels do 58% of the
products of the full ``XᵀX``), and the lower triangle is mirrored from it when ``gram`` is read.
"""

from __future__ import annotations

import torch

MIN_BLOCK = 256
MAX_BLOCKS = 8


def _edges(c: int) -> list[int]:
    k = max(1, min(MAX_BLOCKS, c // MIN_BLOCK))
    return [c * i // k for i in range(k + 1)]


class InputStats:
    """Accumulates ``G``, ``s`` and ``n`` over batches of inputs ``(..., C_in)``."""

    def __init__(self, c_in: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"statistics must be accumulated in float32 or float64, not {dtype}")
        self.c_in = c_in
        self.dtype = dtype  # precision of each batch's product; totals are float64
        self._gram = torch.zeros(c_in, c_in, dtype=torch.float64, device=device)  # upper blocks are current
        self._mirrored = True  # whether the lower triangle matches the upper one
        self._edges = _edges(c_in)
        self.sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self.count = 0

    @property
    def gram(self) -> torch.Tensor | None:
        """``XᵀX`` (float64, exactly symmetric)."""
        if self._gram is not None and not self._mirrored:
            g, e = self._gram, self._edges
            for a, b in zip(e[:-1], e[1:]):
                g[b:, a:b] = g[a:b, b:].T
                d = g[a:b, a:b]
                d.copy_(torch.triu(d) + torch.triu(d, 1).T)
            self._mirrored = True
        return self._gram

    @torch.no_grad()
    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add inputs ``x`` of shape ``(..., C_in)``; ``mask`` of shape ``x.shape[:-1]`` marks real tokens."""
        if x.shape[-1] != self.c_in:
            raise ValueError(f"expected {self.c_in} input channels, got {x.shape[-1]}")
        x = x.reshape(-1, self.c_in)
        if mask is not None:
            x = x[mask.reshape(-1).to(x.device)]
        x = x.to(device=self._gram.device, dtype=self.dtype)
        # TF32 would silently drop mantissa bits of the Gram matrix on Ampere+ GPUs.
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            e = self._edges
            for a, b in zip(e[:-1], e[1:]):  # block row [a, b) of the upper triangle
                self._gram[a:b, a:] += x[:, a:b].T @ x[:, a:]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        self._mirrored = False
        self.sum += x.sum(0, dtype=torch.float64)
        self.count += x.shape[0]

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
        self._gram = self.sum = None


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
