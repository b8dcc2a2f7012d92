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


def compile_step(model, ids, new: int):
    """``(compiled forward, seconds to compile and run one decoding, None)``, or ``(None, 0, error)``."""
    import torch

    step = torch.compile(model.forward, dynamic=False)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():  # not inference_mode: its tensors would make the compiled graph recompile
            _loop(model, step, ids, new)
    except Exception as exc:  # no compiler, an unsupported operation: say which, keep the rest
        return None, 0.0, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    return step, time.perf_counter() - t0, None


def static_decode(model, ids, new: int, compiled: bool, repeats: int = 3, step=None) -> dict[str, Any]:
    """Per-token latency of greedy decoding with a static cache (median over the steps of ``repeats``
    runs after one warm-up run, which for ``compiled`` includes the compilation: ``compile_seconds``).
    ``step``: an already compiled forward (:func:`compile_step`; no warm-up run then)."""
    import torch

    warm = 0.0
    if step is None and compiled:
        step, warm, error = compile_step(model, ids, new)
        if error:
            return {"error": error}
    elif step is None:
        step = model.forward
        with torch.no_grad():
            _loop(model, step, ids, new)
    steps, totals, runs = [], [], []
    with torch.no_grad():
        for _ in range(repeats):
            times, tokens = _loop(model, step, ids, new)
            steps += times
            totals.append(sum(times))
            runs.append(tokens)
    return {
        "batch": ids.shape[0],
        "ms_per_token_median": 1000 * statistics.median(steps),
        "tokens_per_s": ids.shape[0] * new / statistics.median(totals),
        "compile_seconds": warm,
        "tokens": runs[0],
        "deterministic": all(r == runs[0] for r in runs),
    }
