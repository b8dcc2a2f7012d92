"""Greedy text from a checkpoint and from its dense model, side by side, with each one's speed.

What a team wants to see of a pruned model before anything else: does it still say something sensible
for a prompt of theirs, next to the model it came from, and how much faster. The two models are
loaded one after the other (never both in memory), each generates ``max_new_tokens`` greedily from the
same prompt (``do_sample=False``: the same text on every run), and each side's tokens/s is its new
tokens over the wall time of ``generate`` (prefill included, as a user waits for it), after one warm-up
token so that the first call's one-off costs are not charged to either side.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Generation:
    """One side's answer: the new text (the prompt not repeated), how many tokens it is, and their speed."""

    text: str
    tokens: int
    seconds: float
    tokens_per_s: float

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> Generation:
    """``max_new_tokens`` greedy tokens after ``prompt`` (fewer where the model ends its text)."""
    device = next(model.parameters()).device
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    if ids.shape[1] == 0:  # a tokenizer that adds no start token and found no token in the prompt
        raise ValueError("the prompt has no token this model's tokenizer knows")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    options = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=pad)
    model.generate(ids, max_new_tokens=1, **options)  # warm-up: first-call costs are no side's speed
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=max_new_tokens, **options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1] :]
    return Generation(
        text=tokenizer.decode(new, skip_special_tokens=True),
        tokens=int(new.numel()),
        seconds=round(seconds, 4),
        tokens_per_s=round(new.numel() / seconds, 2) if seconds > 0 else 0.0,
    )


def generate_from(name: str, prompt: str, max_new_tokens: int, dtype: str = "auto", device: str = "auto") -> Generation:
    """:func:`greedy` on the model ``name`` (a checkpoint folder, pruned or not, or a hub id) loaded with
    ``dtype`` on ``device`` (a recipe's settings); the model is freed before this returns, so two calls
    in a row never hold both models."""
    from core.models.loading import load_model

    model, tokenizer, _ = load_model(name, dtype, device)
    try:
        if tokenizer is None:
            raise ValueError("the model has no tokenizer to turn the prompt into tokens")
        return greedy(model, tokenizer, prompt, max_new_tokens)
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
