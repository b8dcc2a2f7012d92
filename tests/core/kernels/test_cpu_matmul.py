"""The CPU matrix products through oneDNN (core/kernels/cpu_matmul.py): the same values as a float64
reference wherever they are taken, torch's own path wherever they must not be."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.kernels import cpu_matmul
from core.stats.accumulate import InputStats


@pytest.fixture
def calls(monkeypatch):
    """Counts the products oneDNN computes (per thread name); every size goes to it."""
    monkeypatch.setattr(cpu_matmul, "MIN_MACS", 0)
    assert cpu_matmul.backend() == "onednn", "this torch has oneDNN: the check at first use must have chosen it"
    real = cpu_matmul._onednn_op()
    seen: dict[str, int] = {}

    def counting(*args):
        name = threading.current_thread().name
        seen[name] = seen.get(name, 0) + 1
        return real(*args)

    monkeypatch.setattr(cpu_matmul, "_onednn_op", lambda: counting)
    return seen


def _reference(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def _close(y, ref):
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert (y.double() - ref).norm() <= 1e-6 * ref.norm()


g = torch.Generator().manual_seed(0)
W = torch.randn(48, 80, generator=g)
B = torch.randn(48, generator=g)


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(7, 80, generator=g),
        torch.randn(3, 5, 80, generator=g),
        torch.randn(2, 3, 4, 80, generator=g),
        torch.randn(5, 3, 80, generator=g).transpose(0, 1),  # batch dims permuted, channels still unit-stride
        torch.randn(9, 100, generator=g)[2:8, 10:90],  # a window of a wider matrix
    ],
    ids=["2d", "3d", "4d", "permuted", "window"],
)
@pytest.mark.parametrize("bias", [None, B], ids=["no-bias", "bias"])
def test_linear_through_onednn_matches_float64(calls, x, bias):
    _close(cpu_matmul.linear(x, W, bias), _reference(x, W, bias))
    assert calls.get(threading.current_thread().name) == 1


@pytest.mark.parametrize(
    "case",
    ["column-strided input", "weight window", "float64", "needs grad", "1-d input", "empty weight"],
)
def test_what_onednn_must_not_take_stays_with_torch(calls, case):
    x, w, b = torch.randn(6, 80, generator=g), W.clone(), B.clone()
    if case == "column-strided input":
        x = torch.randn(80, 6, generator=g).T
    elif case == "weight window":  # unit stride along the channels, but not contiguous
        w = torch.randn(50, 90, generator=g)[1:49, 5:85]
    elif case == "float64":
        x, w, b = x.double(), w.double(), b.double()
    elif case == "needs grad":
        w.requires_grad_(True)
    elif case == "1-d input":
        x = x[0]
    else:
        w = w[:0]
        b = b[:0]
    y = cpu_matmul.linear(x, w, b)
    torch.testing.assert_close(y, F.linear(x, w, b))
    assert calls == {}
    if case == "needs grad":  # the fallback keeps autograd working
        y.sum().backward()
        torch.testing.assert_close(w.grad, x.sum(0).expand_as(w))


def test_small_products_stay_with_the_blas(calls, monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MACS", 7 * 80 * 48)
    x = torch.randn(7, 80, generator=g)
    cpu_matmul.linear(x[:6], W)
    assert calls == {}
    _close(cpu_matmul.linear(x, W), _reference(x, W))
    assert sum(calls.values()) == 1


def test_gram_tn_sums_token_chunks_to_float64(calls):
    a, b = torch.randn(600, 70, generator=g), torch.randn(600, 50, generator=g)  # 3 chunks of ≤ 256 tokens
    _close(cpu_matmul.gram_tn(a, b), a.double().T @ b.double())
    assert sum(calls.values()) == 3
    rows = [(0, 30), (30, 70)]
    blocks = cpu_matmul.gram_tn(a, rows=rows)
    ref = a.double().T @ a.double()
    for (r0, r1), block in zip(rows, blocks):
        _close(block, ref[r0:r1, r0:])
    assert sum(calls.values()) == 3 + 3 * 2


def test_gram_chunks_keep_the_error_of_the_blas(calls, monkeypatch):
    """oneDNN adds a product's terms one after another: over 2048 tokens of activations with a
    common offset its float32 Gram is ~4× further from float64 than the BLAS's, in 256-token chunks not."""
    x = torch.randn(2048, 256, generator=g) + 3 * torch.randn(256, generator=g)
    ref = x.double().T @ x.double()

    def err(y):
        return float((y.double() - ref).norm() / ref.norm())

    blas = err(x.T @ x)
    assert err(cpu_matmul.gram_tn(x)) <= 1.5 * blas
    monkeypatch.setattr(cpu_matmul, "REDUCE_CHUNK", 2048)
    assert err(cpu_matmul.gram_tn(x)) > 2 * blas


def test_fast_linear_routes_layers_inside_only_this_thread(calls):
    lin = nn.Linear(80, 48)
    x = torch.randn(4, 80, generator=g)
    other: dict[str, torch.Tensor] = {}

    def elsewhere():
        other["y"] = lin(x)

    with torch.no_grad():
        lin(x)
        assert calls == {}
        with cpu_matmul.fast_linear("cpu"):
            y = lin(x)
            worker = threading.Thread(target=elsewhere, name="elsewhere")
            worker.start()
            worker.join()
            with cpu_matmul.stock_linear():
                lin(x)
            with cpu_matmul.fast_linear("cpu"):  # nested: still one interception a call
                lin(x)
        lin(x)
    me = threading.current_thread().name
    assert calls == {me: 2}, "inside: the two unsuspended calls; the other thread and outside: torch's"
    assert nn.Linear.forward is cpu_matmul._stock_forward, "torch's own forward once no thread is inside"
    _close(y, _reference(x, lin.weight, lin.bias))
    torch.testing.assert_close(other["y"], F.linear(x, lin.weight, lin.bias))


def test_fast_linear_on_another_device_intercepts_nothing(calls):
    lin = nn.Linear(80, 48)
    with torch.no_grad(), cpu_matmul.fast_linear(torch.device("meta")):
        lin(torch.randn(4, 80, generator=g))
    assert calls == {}


def test_gram_through_onednn_matches_float64(calls):
    x = torch.randn(600, 520, generator=g)  # two block rows of the upper triangle
    stats = InputStats(520, torch.float32)
    stats.add_batch(x[:250])
    stats.add_batch(x[250:])
    ref = x.double().T @ x.double()
    assert (stats.gram - ref).norm() <= 1e-6 * ref.norm()
    torch.testing.assert_close(stats.gram, stats.gram.T, rtol=0, atol=0)
    assert sum(calls.values()) == 3 * 2  # one flush (under 2048 tokens): 3 chunks, two block rows each


@pytest.mark.parametrize("value", ["blas", "onednn", "auto", ""])
def test_the_environment_chooses_the_library(monkeypatch, value):
    monkeypatch.setenv(cpu_matmul.ENV, value)
    cpu_matmul.backend.cache_clear()
    try:
        assert cpu_matmul.backend() == ("blas" if value == "blas" else "onednn")
    finally:
        cpu_matmul.backend.cache_clear()


def test_an_unknown_choice_is_refused_in_one_sentence(monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV, "mkl")
    cpu_matmul.backend.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"^LIAR_CPU_MATMUL must be one of auto, onednn, blas, not 'mkl'$"):
            cpu_matmul.backend()
    finally:
        cpu_matmul.backend.cache_clear()


def test_a_failing_check_falls_back_to_the_blas(monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(cpu_matmul, "_onednn_op", lambda: broken)
    cpu_matmul.backend.cache_clear()
    try:
        assert cpu_matmul.backend() == "blas"
        x = torch.randn(4, 80, generator=g)
        torch.testing.assert_close(cpu_matmul.linear(x, W, B), F.linear(x, W, B))
    finally:
        cpu_matmul.backend.cache_clear()


def _prune(llama_dir, corpus, **kw):
    from core.pipeline.sequential import prune
    from tests.conftest import recipe_for

    # damped as the slow-reference tests are: float32 rounding is not amplified by a singular Gram
    recipe = recipe_for(
        llama_dir, corpus, dtype="float32", device="cpu", reconstruction={"method": "liar", "damp": 1e-3}
    )
    result = prune(recipe, **kw)
    ids = torch.randint(0, 60, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = result.model(input_ids=ids).logits.double()
    return result, logits, {k: v.double() for k, v in result.model.state_dict().items()}


def test_a_cpu_prune_multiplies_through_onednn_and_agrees_with_the_blas(calls, monkeypatch, llama_dir, corpus):
    _, fast_logits, fast = _prune(llama_dir, corpus)
    assert sum(calls.values()) > 50, "the projections, replays and Gram products of every block"
    monkeypatch.setenv(cpu_matmul.ENV, "blas")
    cpu_matmul.backend.cache_clear()
    try:
        _, blas_logits, blas = _prune(llama_dir, corpus)
    finally:
        cpu_matmul.backend.cache_clear()
    # float32 products summed in another order, through the LIAR solves: the slow-reference tests'
    # tolerance on the logits (tests/core/pipeline/test_pipeline.py)
    torch.testing.assert_close(fast_logits, blas_logits, rtol=1e-4, atol=1e-4)
    assert fast.keys() == blas.keys()
    for name, w in blas.items():
        assert (fast[name] - w).norm() <= 1e-3 * w.norm(), name


def test_block_timings_run_torch_s_own_kernels(calls, monkeypatch, llama_dir, corpus):
    from core.pipeline import measure

    inside: list[int] = []
    real = measure.BlockSpeed._time

    def timed(self, *args):
        before = sum(calls.values())
        real(self, *args)
        inside.append(sum(calls.values()) - before)

    monkeypatch.setattr(measure.BlockSpeed, "_time", timed)
    result, _, _ = _prune(llama_dir, corpus, measure_speed=True)
    assert len(inside) == 4 and inside == [0] * 4  # 2 blocks, dense and pruned: no oneDNN product timed
    assert result.metrics["block_speedup"] > 0


def _with_blas(monkeypatch, fn):
    monkeypatch.setenv(cpu_matmul.ENV, "blas")
    cpu_matmul.backend.cache_clear()
    try:
        return fn()
    finally:
        monkeypatch.delenv(cpu_matmul.ENV)
        cpu_matmul.backend.cache_clear()


def test_evaluations_multiply_through_onednn(calls, monkeypatch, llama_dir, bert_dir, corpus):
    from core.evaluation.encoder import evaluate_classifier
    from core.evaluation.perplexity import perplexity
    from core.models.loading import load_model

    model, tok, _ = load_model(str(llama_dir), "float32", "cpu")
    ppl = perplexity(model, tok, corpus[:6], seq_len=16)
    assert sum(calls.values()) > 0
    blas = _with_blas(monkeypatch, lambda: perplexity(model, tok, corpus[:6], seq_len=16))
    assert ppl["perplexity"] == pytest.approx(blas["perplexity"], rel=1e-5)

    before = sum(calls.values())
    bert, bert_tok, _ = load_model(str(bert_dir), "float32", "cpu")
    records = [{"text": text, "label": i % 2} for i, text in enumerate(corpus[:8])]
    scores = evaluate_classifier(bert, bert_tok, records, return_predictions=True)
    assert sum(calls.values()) > before
    blas = _with_blas(monkeypatch, lambda: evaluate_classifier(bert, bert_tok, records, return_predictions=True))
    assert scores["predictions"] == blas["predictions"]
