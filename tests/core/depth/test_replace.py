"""The depth stand-in against float64 least squares on raw activations, and the surgery that folds it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.depth.replace import DepthError, SpanFit, fit_span, fold, remove_blocks
from core.models.adapter import adapter_for
from core.models.tiny import tiny_decoder


def _model(tmp_path, family="llama", layers=4):
    # an FFN wider than the residual stream, as in real models: the FFN's outputs span it (full-rank Gram)
    path = tiny_decoder(tmp_path / family, family=family, num_hidden_layers=layers, intermediate_size=96)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), path


def _batches(vocab: int, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(4, vocab, (2, 40), generator=gen)
        mask = torch.ones_like(ids)
        mask[1, 40 - 3 * (i + 1) :] = 0  # padding that must not count
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def _raw(model, adapter, batches, start, end):
    """m, r, y of every real token, by a second pass that stores them all (the slow reference)."""
    layers, rows = adapter.layers(model), {"m": [], "h": [], "y": []}
    store = {}

    def keep(name):
        return lambda mod, inp, out: store.__setitem__(name, out[0] if isinstance(out, tuple) else out)

    hooks = [
        layers[start - 1].mlp.down_proj.register_forward_hook(keep("m")),
        layers[start - 1].register_forward_hook(keep("h")),
        layers[end - 1].register_forward_hook(keep("y")),
    ]
    with torch.no_grad():
        for b in batches:
            model(**b)
            for k in rows:
                rows[k].append(store[k][b["attention_mask"].bool()].double())
    for h in hooks:
        h.remove()
    m, h, y = (torch.cat(rows[k]) for k in ("m", "h", "y"))
    return m, h - m, y


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("span", [(1, 2), (1, 3), (2, 4)])
def test_streamed_fit_equals_float64_lstsq(tmp_path, span, normalise):
    model, _ = _model(tmp_path)
    adapter = adapter_for(model)
    batches = _batches(model.config.vocab_size)
    fit, scores = fit_span(model, adapter, batches, *span, normalise=normalise)
    m_raw, r_raw, y = _raw(model, adapter, batches, *span)
    h = r_raw + m_raw
    plain = float(((y - h) ** 2).sum() / (y**2).sum())
    w = 1.0 / y.norm(dim=1, keepdim=True) if normalise else torch.ones(len(y), 1, dtype=torch.float64)
    m, r, y = m_raw * w, r_raw * w, y * w  # each token's row weighted by 1/‖y‖ (or not): the same least squares
    assert fit.rows == m.shape[0] == 2 * 40 * 3 - (3 + 6 + 9)
    expected = torch.linalg.lstsq(m, y - r).solution  # QR on the raw rows; the fit solves normal equations,
    got = fit.solve(damp=0.0)  # whose conditioning is the square of theirs: compare as a whole
    assert float(torch.linalg.norm(got - expected) / torch.linalg.norm(expected)) < 1e-6
    t = fit.solve(damp=0.01)
    direct = float(((m @ t - (y - r)) ** 2).sum() / ((y - r) ** 2).sum())
    assert fit.relative_error(t) == pytest.approx(direct, rel=1e-8)
    assert scores["plain_error"] == pytest.approx(plain, rel=1e-9)
    one = SpanFit(width=m.shape[1])  # one batch of everything: the same statistics
    one.add_batch(m, y - r)
    torch.testing.assert_close(one.gram, fit.gram) and torch.testing.assert_close(one.cross, fit.cross)


def test_folded_model_is_the_span_replaced_by_its_map_and_reloads_stock(tmp_path):
    model, _ = _model(tmp_path, layers=5)
    adapter = adapter_for(model)
    batches = _batches(model.config.vocab_size)
    start, end = 2, 4
    t = fit_span(model, adapter, batches, start, end)[0].solve(damp=0.01).float()
    ids = torch.randint(4, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(9))

    # reference: the unpruned model with block start-1's output r + m replaced by r + m T and the span skipped
    layers, seen = adapter.layers(model), {}
    hooks = [layers[start - 1].mlp.down_proj.register_forward_hook(lambda mod, i, o: seen.__setitem__("m", o))]

    def replace_output(mod, args, out):
        h = out[0] if isinstance(out, tuple) else out
        new = h - seen["m"] + seen["m"] @ t
        return (new, *out[1:]) if isinstance(out, tuple) else new

    def identity(mod, args, kwargs, out):
        h = args[0] if args else kwargs["hidden_states"]
        return (h, *out[1:]) if isinstance(out, tuple) else h

    hooks.append(layers[start - 1].register_forward_hook(replace_output))
    hooks += [layers[i].register_forward_hook(identity, with_kwargs=True) for i in range(start, end)]
    with torch.no_grad():
        expected = model(ids).logits
    for h in hooks:
        h.remove()

    fold(model, adapter, start, t)
    remove_blocks(model, adapter, list(range(start, end)))
    assert model.config.num_hidden_layers == 3
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        # the key/value cache is indexed by the renumbered layers: cached greedy decoding runs and agrees
        out = model.generate(ids, max_new_tokens=5, do_sample=False)
        step = ids
        for _ in range(5):
            step = torch.cat([step, model(step).logits[:, -1:].argmax(-1)], dim=1)
        assert torch.equal(out, step)
    model.save_pretrained(tmp_path / "shallow")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "shallow", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_spans_that_cannot_take_the_fold_are_refused(tmp_path):
    model, _ = _model(tmp_path)
    adapter = adapter_for(model)
    with pytest.raises(DepthError, match="first block has no FFN before it"):
        fit_span(model, adapter, _batches(model.config.vocab_size), 0, 2)
    with pytest.raises(DepthError, match="removing every block leaves no model"):
        remove_blocks(model, adapter, [0, 1, 2, 3])
    gemma, _ = _model(tmp_path, family="gemma3", layers=2)
    with pytest.raises(DepthError, match="normalises the FFN's output before the residual stream"):
        fit_span(gemma, adapter_for(gemma), _batches(gemma.config.vocab_size), 1, 2)
