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
from core.kernels.cpu_matmul import route_linears


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
    windows = _windows(model.config, tokenizer, source, seq_len, max_windows)
    device = next(model.parameters()).device
    total_nll = 0.0
    with route_linears(model, device):
        for i in tqdm(range(0, len(windows), batch_size), desc="perplexity", disable=not show_progress):
            batch = windows[i : i + batch_size].to(device)
            total_nll += _nll(model(input_ids=batch, use_cache=False).logits, batch)
    return _summary(total_nll, windows)


@torch.no_grad()
def perplexity_streamed(
    directory: str | Path,
    tokenizer,
    source: str | Path | list[str],
    seq_len: int = 512,
    batch_size: int = 4,
    max_windows: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    show_progress: bool = False,
    activations: str = "auto",
) -> dict[str, float]:
    """:func:`perplexity` of a checkpoint whose blocks are read one at a time (for models larger
    than the device): every window passes through block ℓ before block ℓ+1 is read; only the
    embeddings, the head, one block and the windows' hidden states are on the device — or, with
    ``activations`` host (auto: when they would not fit), the hidden states wait in host memory
    (``core/models/offload.py``). ``tokenizer`` None: the checkpoint's own."""
    from core.evaluation.streamed import final_states, open_decoder, output_logits

    sm = open_decoder(directory, dtype, device)
    try:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory, config=sm.model.config)
        windows = _windows(sm.model.config, tokenizer, source, seq_len, max_windows)
        batches = [windows[i : i + batch_size].to(sm.device) for i in range(0, len(windows), batch_size)]
        with route_linears(sm.model, sm.device):
            hidden, offload = final_states(sm, batches, activations, show_progress, "perplexity")
    finally:
        sm.close()
    logits = output_logits(sm)
    with route_linears(sm.model, sm.device):
        total_nll = sum(_nll(logits(offload.fetch(h)), b) for h, b in zip(hidden, batches))
    return _summary(total_nll, windows)


def eval_windows(
    config, tokenizer, source: str | Path | list[str], seq_len: int = 512, max_windows: int | None = None
) -> list[list[int]]:
    """The token ids of the windows :func:`perplexity` scores (the same arguments), as lists: what an
    engine of its own (llama.cpp, ``core.serving.quality``) is given to score the same tokens.
    ``config``: anything with the model's ``max_position_embeddings`` (or without it: no limit)."""
    return _windows(config, tokenizer, source, seq_len, max_windows).tolist()


def _windows(config, tokenizer, source, seq_len: int, max_windows: int | None) -> torch.Tensor:
    limit = getattr(config, "max_position_embeddings", None)
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
    return ids[: n_windows * seq_len].view(n_windows, seq_len)


def _nll(logits: torch.Tensor, batch: torch.Tensor) -> float:
    """Summed next-token negative log-likelihood of a batch of windows."""
    logits = logits.float()
    return float(
        F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
    )


def _summary(total_nll: float, windows: torch.Tensor) -> dict[str, float]:
    total_tokens = windows[:, 1:].numel()
    mean = total_nll / total_tokens
    return {
        "perplexity": math.exp(mean),
        "nll": mean,
        "tokens": total_tokens,
        "windows": windows.shape[0],
        "seq_len": windows.shape[1],
    }
