"""Greedy decoding with a static KV cache, eager or compiled (``torch.compile``), for ``bench/speed.py``.

A static cache (``transformers.StaticCache``) has fixed shapes, so one compiled graph of the model's
forward serves every decoding step (``dynamic=False``: one graph per batch size). The prompt is
prefilled eagerly; each step then runs the compiled forward on one token per sequence. On a CPU,
``torch.compile`` generates C++ through Inductor, so it needs a C++ compiler; when compiling fails,
the error is returned instead of timings.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def _loop(model, step, ids, new: int) -> tuple[list[float], list[list[int]]]:
    """One prefill and ``new`` greedy steps through ``step`` (the forward, eager or compiled)."""
    import torch
    from transformers import StaticCache

    batch, length = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=length + new)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(length))
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens, times = [nxt[:, 0].tolist()], []
    for i in range(new):
        pos = torch.tensor([length + i])
        t = time.perf_counter()
        out = step(input_ids=nxt, past_key_values=cache, use_cache=True, cache_position=pos)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t)
        tokens.append(nxt[:, 0].tolist())
    return times, tokens


def static_decode(model, ids, new: int, compiled: bool, repeats: int = 3) -> dict[str, Any]:
    """Per-token latency of greedy decoding with a static cache (median over the steps of ``repeats``
    runs after one warm-up run, which for ``compiled`` includes the compilation: ``compile_seconds``)."""
    import torch

    step = torch.compile(model.forward, dynamic=False) if compiled else model.forward
    with torch.no_grad():  # not inference_mode: its tensors would make the compiled graph recompile
        t0 = time.perf_counter()
        try:
            _, tokens = _loop(model, step, ids, new)
        except Exception as exc:  # no compiler, an unsupported operation: say which, keep the rest
            return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}
        warm = time.perf_counter() - t0
        steps, totals = [], []
        for _ in range(repeats):
            times, again = _loop(model, step, ids, new)
            steps += times
            totals.append(sum(times))
    batch = ids.shape[0]
    return {
        "batch": batch,
        "ms_per_token_median": 1000 * statistics.median(steps),
        "tokens_per_s": batch * new / statistics.median(totals),
        "compile_seconds": warm if compiled else 0.0,
        "tokens": tokens,
        "deterministic": again == tokens,
    }
