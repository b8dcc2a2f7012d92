"""Realised speed of a model where it runs: prefill throughput on random tokens, a few seconds.

Every job measures the dense model before pruning and the pruned one after, on its own worker, so the
speed-up users pick a model by is measured rather than promised (exact FFN widths ran slower than the
dense model on a GPU: ``docs/results/gpu_latency.md``); each side is timed several times, and
:func:`prefill_speedup` gives the spread a reader weighs the figure against (a busy worker's single
timing is noise).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class PrefillTiming:
    """Seconds of each timed prefill of one model (after an untimed warm-up) over ``tokens`` tokens."""

    tokens: int
    seconds: list[float]

    @property
    def tokens_per_second(self) -> float:
        """The median run's throughput."""
        return self.tokens / statistics.median(self.seconds)


@torch.no_grad()
def prefill_timing(
    model: nn.Module, batch: int = 4, seq_len: int = 128, repeats: int = 3, seed: int = 0
) -> PrefillTiming:
    """``repeats`` timed forwards over ``batch × seq_len`` random tokens (after one warm-up), on the
    model's device and dtype, synchronised on GPUs; ``seq_len`` is capped by the model's positions."""
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
    seconds = [run() for _ in range(repeats)]
    model.train(was_training)
    return PrefillTiming(ids.numel(), seconds)


def prefill_tokens_per_second(
    model: nn.Module, batch: int = 4, seq_len: int = 128, repeats: int = 3, seed: int = 0
) -> float:
    """Median tokens/s of one forward over ``batch × seq_len`` random tokens (:func:`prefill_timing`)."""
    return prefill_timing(model, batch, seq_len, repeats, seed).tokens_per_second


def prefill_speedup(dense: PrefillTiming, pruned: PrefillTiming) -> tuple[float, float, float]:
    """``(median, low, high)`` speed-up of the pruned model over the dense one, from timings taken
    apart (a model pruned in place: the dense one is gone once the pruned one exists, so the two
    cannot be interleaved and no run of one pairs with a run of the other). The median is the ratio of
    the medians; the interval pairs the extremes — the fastest dense run against the slowest pruned
    one (low), the slowest dense run against the fastest pruned one (high) — so it holds the ratio of
    every dense run to every pruned run: conservative, as a figure timed minutes apart must be."""
    d, p = dense.seconds, pruned.seconds
    return statistics.median(d) / statistics.median(p), min(d) / max(p), max(d) / min(p)


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
