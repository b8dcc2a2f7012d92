"""Streaming second-order statistics of a linear layer's input.

Following the accumulator shape of SparseGPT/GPTQ (``add_batch`` → solve → ``free``), but for the
affine problems of the paper we keep three sufficient statistics of the input X (n_tokens, C_in):

    G = XᵀX  (C_in, C_in)     s = Xᵀ1  (C_in,)     n = number of tokens

Padding tokens are excluded through a boolean token mask. X itself is never stored.
Each batch's product is computed in ``dtype`` (float32 or float64, never TF32) and added to float64
running totals, so long streams do not lose precision however many batches they have.
"""

from __future__ import annotations

import torch


class InputStats:
    """Accumulates ``G``, ``s`` and ``n`` over batches of inputs ``(..., C_in)``."""

    def __init__(self, c_in: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"statistics must be accumulated in float32 or float64, not {dtype}")
        self.c_in = c_in
        self.dtype = dtype  # precision of each batch's product; totals are float64
        self.gram = torch.zeros(c_in, c_in, dtype=torch.float64, device=device)
        self.sum = torch.zeros(c_in, dtype=torch.float64, device=device)
        self.count = 0

    @torch.no_grad()
    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add inputs ``x`` of shape ``(..., C_in)``; ``mask`` of shape ``x.shape[:-1]`` marks real tokens."""
        if x.shape[-1] != self.c_in:
            raise ValueError(f"expected {self.c_in} input channels, got {x.shape[-1]}")
        x = x.reshape(-1, self.c_in)
        if mask is not None:
            x = x[mask.reshape(-1).to(x.device)]
        x = x.to(device=self.gram.device, dtype=self.dtype)
        # TF32 would silently drop mantissa bits of the Gram matrix on Ampere+ GPUs.
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            product = x.T @ x
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        self.gram += product
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
        self.gram = self.sum = None
