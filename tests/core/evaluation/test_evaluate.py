"""Perplexity equals a hand computation over non-overlapping windows."""

import math

import pytest
import torch
import torch.nn.functional as F

from core.evaluation.perplexity import perplexity
from core.models.loading import load_model


def test_perplexity_matches_manual_computation(llama_dir, corpus):
    model, tok, _ = load_model(str(llama_dir), "float32", "cpu")
    result = perplexity(model, tok, corpus[:5], seq_len=16, batch_size=3)
    ids = tok(tok.eos_token.join(corpus[:5]), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    n = len(ids) // 16
    nll = 0.0
    with torch.no_grad():
        for i in range(n):
            w = ids[i * 16 : (i + 1) * 16][None]
            logits = model(w).logits[0, :-1]
            nll += F.cross_entropy(logits, w[0, 1:], reduction="sum").item()
    assert result["windows"] == n and result["tokens"] == n * 15
    assert result["perplexity"] == pytest.approx(math.exp(nll / (n * 15)), rel=1e-5)


def test_perplexity_errors(llama_dir):
    model, tok, _ = load_model(str(llama_dir), "float32", "cpu")
    with pytest.raises(ValueError, match="fewer than one window"):
        perplexity(model, tok, ["the model"], seq_len=64)
    with pytest.raises(ValueError, match="exceeds the model's limit"):
        perplexity(model, tok, ["the model"], seq_len=1000)
    with pytest.raises(FileNotFoundError, match="neither a named set nor a file"):
        perplexity(model, tok, "/no/such.txt", seq_len=8)


def test_prefill_speed_is_measured_and_capped_by_positions(llama_dir):
    from core.evaluation.speed import prefill_tokens_per_second
    from core.models.loading import load_model

    model, _, _ = load_model(str(llama_dir), "float32", "cpu")
    model.train()
    speed = prefill_tokens_per_second(model, batch=2, seq_len=10**6, repeats=2)  # capped at 256 positions
    assert speed > 0 and model.training  # the mode is restored
