"""Realised speed of a model where it runs: prefill throughput on random tokens, a few seconds.

Every job measures the dense model before pruning and the pruned one after, on its own worker, so the
speed-up users pick a model by is measured rather than promised (exact FFN widths ran slower than the
dense model on a GPU: ``docs/results/gpu_latency.md``).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn


@torch.no_grad()
def prefill_tokens_per_second(
    model: nn.Module, batch: int = 4, seq_len: int = 128, repeats: int = 3, seed: int = 0
) -> float:
    """Median tokens/s of one forward over ``batch × seq_len`` random tokens (after one warm-up),
    on the model's device and dtype; ``seq_len`` is capped by the model's positions."""
    config = model.config
    limit = getattr(config, "max_position_embeddings", None) or seq_len
    seq_len = max(2, min(seq_len, limit))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen).to(device)
    mask = torch.ones_like(ids)
    was_training = model.training
    model.eval()

    def run() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    run()  # warm-up
    seconds = statistics.median(run() for _ in range(repeats))
    model.train(was_training)
    return batch * seq_len / seconds
