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


@torch.no_grad()
def decode_ms_per_token(model: nn.Module, prompt: int = 128, new: int = 32, seed: int = 0) -> float:
    """Milliseconds per generated token of batch-1 greedy decoding after a random ``prompt``-token
    prompt (``model.generate`` with its default key/value cache), on the model's device and dtype: the
    latency a chat user feels. The prompt's prefill is not counted: the time of generating one token
    is subtracted from that of ``new + 1``."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=gen).to(device)
    was_training = model.training
    model.eval()
    pad = getattr(model.config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0

    def seconds(tokens: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    one = seconds(1)
    total = seconds(new + 1)
    model.train(was_training)
    return 1000 * max(total - one, 0.0) / new
