"""Perplexity of a causal language model on a named dataset, a local text file or strings.

The text is tokenized as one stream and cut into non-overlapping windows of ``seq_len`` tokens (the
tail shorter than a window is dropped); perplexity is ``exp`` of the mean next-token negative
log-likelihood over every predicted token of every window.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from core.data.texts import eval_texts


@torch.no_grad()
def perplexity(
    model,
    tokenizer,
    source: str | Path | list[str],
    seq_len: int = 512,
    batch_size: int = 4,
    max_windows: int | None = None,
    show_progress: bool = False,
) -> dict[str, float]:
    """Returns ``{"perplexity", "nll", "tokens", "windows", "seq_len"}``."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if seq_len < 2:
        raise ValueError("seq_len must be at least 2")
    if limit is not None and seq_len > limit:
        raise ValueError(f"seq_len {seq_len} exceeds the model's limit of {limit} positions")
    sep = tokenizer.eos_token or "\n\n"
    ids = tokenizer(sep.join(eval_texts(source)), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    n_windows = len(ids) // seq_len
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows == 0:
        raise ValueError(f"the evaluation text has {len(ids)} tokens, fewer than one window of {seq_len}")
    windows = ids[: n_windows * seq_len].view(n_windows, seq_len)
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for i in tqdm(range(0, n_windows, batch_size), desc="perplexity", disable=not show_progress):
        batch = windows[i : i + batch_size].to(device)
        logits = model(input_ids=batch, use_cache=False).logits.float()
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total_nll += float(nll)
        total_tokens += batch[:, 1:].numel()
    mean = total_nll / total_tokens
    return {
        "perplexity": math.exp(mean),
        "nll": mean,
        "tokens": total_tokens,
        "windows": n_windows,
        "seq_len": seq_len,
    }
