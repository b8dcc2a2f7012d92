"""The span choice one block at a time against the whole-model passes it stands for, and against the
model cut for good (float64 loss from the logits)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.depth.blockwise import Walk, choose_span_by_blocks, enter
from core.depth.replace import fit_spans, fold, remove_blocks
from core.depth.select import choose_span
from core.models.adapter import adapter_for
from core.models.offload import Offload
from core.models.tiny import tiny_decoder
from tests.core.depth.test_select import _reference_loss

ALTERNATING = ["sliding_attention", "full_attention"] * 3


def six_block_models(root) -> dict:
    """Six blocks each, an FFN wider than the residual stream (every span has a stand-in): LLaMA; Qwen2
    whose sliding-window (8 tokens) and full-attention blocks alternate, so a span of odd length shifts
    the blocks after it onto positions of the other type; Gemma 3 (no fold: plain removal only)."""
    kw = dict(num_hidden_layers=6, intermediate_size=96)
    sliding = dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, layer_types=ALTERNATING)
    return {
        "llama": tiny_decoder(root / "llama", **kw),
        "qwen2": tiny_decoder(root / "qwen2", "qwen2", **kw, **sliding),
        "gemma3": tiny_decoder(root / "gemma3", "gemma3", **kw, layer_types=ALTERNATING),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return six_block_models(tmp_path_factory.mktemp("blockwise"))


def _batches(vocab, n, seed, pad=True):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(4, vocab, (3, 20), generator=gen)
        mask = torch.ones_like(ids)
        if pad:
            mask[1, 20 - 2 * (i + 1) :] = 0  # right padding that must not count
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


class _Counted:
    """The model's own blocks as a walk's: every load counted, and no block loaded twice in a row
    without being freed."""

    def __init__(self, model, adapter):
        self.layers, self.loads, self.live = adapter.layers(model), [], set()

    def load(self, i):
        assert not self.live, f"block {i} loaded while {self.live} is still in memory"
        self.loads.append(i)
        self.live.add(i)
        return self.layers[i]

    def free(self, i):
        self.live.discard(i)


def _logits(model, adapter):
    norm = model.base_model.get_submodule(adapter.family.final_norm)
    cap = getattr(model.config, "final_logit_softcapping", None)

    def head(h):
        out = model.get_output_embeddings()(norm(h))
        return out if not cap else torch.tanh(out / cap) * cap

    return lambda: head


def _blockwise(model, adapter, fit, held, request):
    blocks = _Counted(model, adapter)
    offload = Offload("cpu")
    walk = Walk(n=len(blocks.layers), load=blocks.load, free=blocks.free, offload=offload)

    def windows(which):
        return enter(model, adapter, fit if which == "fit" else held, "cpu", offload)

    return choose_span_by_blocks(walk, windows, adapter, _logits(model, adapter), request), blocks.loads


CASES = [
    ("llama", 2, "loss", "ls"),
    ("llama", 3, "loss", "none"),
    ("llama", 2, "fit", "ls"),
    ("llama", 2, "angular", "ls"),
    ("llama", 2, "fit", "none"),
    ("qwen2", 1, "loss", "ls"),
    ("qwen2", 3, "angular", "none"),
    ("gemma3", 1, "loss", "none"),
]


@pytest.mark.parametrize("family, k, select, reconstruction", CASES)
def test_blockwise_choice_equals_the_whole_model_passes(models, family, k, select, reconstruction):
    model = AutoModelForCausalLM.from_pretrained(models[family], dtype=torch.float32).eval()
    adapter = adapter_for(model)
    vocab = model.config.vocab_size
    fit, held = _batches(vocab, 3, seed=1), _batches(vocab, 2, seed=2)
    expected = choose_span(model, adapter, fit, held, k, select, reconstruction, damp=0.01)
    got, loads = _blockwise(model, adapter, fit, held, (k, select, reconstruction, 0.01))
    # each block read once per pass: the fit pass, and the loss pass for select loss
    assert loads == list(range(6)) * (2 if select == "loss" else 1)
    assert (got.start, got.end, got.weighted) == (expected.start, expected.end, expected.weighted)
    assert got.candidates.keys() == expected.candidates.keys()
    for s, cand in expected.candidates.items():
        assert got.candidates[s].keys() == cand.keys(), s
        for key, value in cand.items():
            assert got.candidates[s][key] == pytest.approx(value, rel=1e-6, abs=1e-12), (s, key)
    if expected.t is None:
        assert got.t is None
    else:
        torch.testing.assert_close(got.t, expected.t, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family, k, reconstruction", [("llama", 2, "ls"), ("qwen2", 1, "ls"), ("gemma3", 1, "none")])
def test_blockwise_losses_are_those_of_the_models_cut_for_good(models, family, k, reconstruction):
    """Each candidate's loss is the float64 loss of a copy of the model with the span folded and removed
    for good (its config's per-layer types trimmed with it)."""
    model = AutoModelForCausalLM.from_pretrained(models[family], dtype=torch.float32).eval()
    adapter = adapter_for(model)
    vocab = model.config.vocab_size
    fit, held = _batches(vocab, 2, seed=3), _batches(vocab, 2, seed=4, pad=False)
    choice, _ = _blockwise(model, adapter, fit, held, (k, "loss", reconstruction, 0.01))
    for start, cand in choice.candidates.items():
        for key in ("loss_weighted", "loss_plain") if reconstruction == "ls" else ("loss",):
            cut = copy.deepcopy(model)
            cut_adapter = adapter_for(cut)
            if reconstruction == "ls":  # that variant's stand-in, fitted on the whole model
                span = (start, start + k)
                fits = fit_spans(cut, cut_adapter, fit, [span], normalise=key == "loss_weighted")
                fold(cut, cut_adapter, start, fits[span][0].solve(0.01))
            remove_blocks(cut, cut_adapter, list(range(start, start + k)))
            assert cand[key] == pytest.approx(_reference_loss(cut, held), rel=1e-5), (start, key)
