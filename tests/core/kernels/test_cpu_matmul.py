"""The CPU matrix products through oneDNN (core/kernels/cpu_matmul.py): the same values as a float64
reference wherever they are taken, torch's own path wherever they must not be."""

from __future__ import annotations

import threading
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core.kernels import cpu_matmul
from core.stats.accumulate import InputStats


@pytest.fixture(autouse=True)
def unconfigured():
    """Every test starts and ends in a process no application configured (the BLAS everywhere)."""
    cpu_matmul.reset()
    yield
    cpu_matmul.reset()


@pytest.fixture
def calls(monkeypatch):
    """Counts the products oneDNN computes (per thread name), configured on as the CLI would; every
    size goes to it."""
    monkeypatch.setattr(cpu_matmul, "MIN_MACS", 0)
    cpu_matmul.configure("onednn")
    assert cpu_matmul.backend() == "onednn", "this torch has oneDNN: the check must have chosen it"
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


def test_gram_through_onednn_matches_float64(calls):
    x = torch.randn(600, 520, generator=g)  # two block rows of the upper triangle
    stats = InputStats(520, torch.float32)
    stats.add_batch(x[:250])
    stats.add_batch(x[250:])
    ref = x.double().T @ x.double()
    assert (stats.gram - ref).norm() <= 1e-6 * ref.norm()
    torch.testing.assert_close(stats.gram, stats.gram.T, rtol=0, atol=0)
    assert sum(calls.values()) == 3 * 2  # one flush (under 2048 tokens): 3 chunks, two block rows each


class _Two(nn.Module):
    """Two projections; ``extra`` is added by the test while a route is open (as a surgery adds one)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(80, 48), nn.Linear(48, 48)

    def forward(self, x):
        y = self.b(self.a(x))
        return self.extra(y) if hasattr(self, "extra") else y


def _installed(model: nn.Module) -> list[str]:
    """Names of the modules holding a forward of their own or forward pre-hooks."""
    return [n for n, m in model.named_modules() if "forward" in m.__dict__ or m._forward_pre_hooks]


def test_a_route_covers_one_model_s_linears_and_leaves_nothing_behind(calls):
    stock = nn.Linear.forward
    model, other, x = _Two(), _Two(), torch.randn(4, 80, generator=g)
    own = lambda inp: F.linear(inp, other.b.weight, other.b.bias)  # noqa: E731 — a forward set by someone else
    other.b.forward = own
    with torch.no_grad():
        with cpu_matmul.route_linears(model, "cpu"):
            assert nn.Linear.forward is stock, "torch's class is never changed"
            y = model(x)
            assert calls == {threading.current_thread().name: 2}
            other(x)  # another model: torch's products
            assert sum(calls.values()) == 2
            model.extra = nn.Linear(48, 48)  # a new projection: routed when its parent next runs
            model(x)
            assert sum(calls.values()) == 2 + 3
            with cpu_matmul.lifted(model):  # a timing of the stock forward
                model(x)
            assert sum(calls.values()) == 5
            with cpu_matmul.route_linears(other, "cpu"):  # a forward set before is left as it is
                assert other.b.__dict__["forward"] is own and sum(calls.values()) == 5
        assert nn.Linear.forward is stock
        assert _installed(model) == [] and other.b.__dict__["forward"] is own and _installed(other) == ["b"]
        model(x)
    assert sum(calls.values()) == 5
    _close(y, _reference(model.a(x).detach(), model.b.weight, model.b.bias))


def test_a_route_is_removed_when_the_run_raises_and_its_modules_are_not_kept_alive(calls):
    model = _Two()
    with pytest.raises(RuntimeError, match="stopped"), cpu_matmul.route_linears(model, "cpu"):
        model(torch.randn(4, 80, generator=g))
        raise RuntimeError("stopped")
    assert _installed(model) == []
    with cpu_matmul.route_linears(model, "cpu"):
        dropped = weakref.ref(model.a)
        model.a = nn.Linear(80, 48)  # a surgery replaces a projection: the old one is freed at once
        assert dropped() is None, "the route holds its modules weakly (no cycle keeps old weights)"


def test_nothing_is_routed_on_another_device_or_unless_an_application_configured_it(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MACS", 0)
    model = _Two()
    with cpu_matmul.route_linears(model, "cpu"):  # a library caller: no configure
        assert cpu_matmul.backend() == "blas" and _installed(model) == []
    assert not cpu_matmul.takes(torch.randn(4, 80))
    cpu_matmul.configure("onednn")
    with cpu_matmul.route_linears(model, torch.device("meta")):
        assert _installed(model) == []
    with cpu_matmul.route_linears(model, "cpu"):
        assert _installed(model) == ["", "a", "b"]  # the parent's pre-hook, the two projections


@pytest.mark.parametrize("value", ["blas", "onednn", "auto", ""])
def test_the_environment_chooses_the_library(monkeypatch, value):
    monkeypatch.setenv(cpu_matmul.ENV, value)
    monkeypatch.setattr(cpu_matmul, "measure_rates", lambda: (300.0, 100.0))
    cpu_matmul.configure()
    assert cpu_matmul.backend() == ("blas" if value == "blas" else "onednn")
    assert cpu_matmul.decision().requested == (value or "auto")


@pytest.mark.parametrize(
    "rates, chosen", [((118.0, 131.0), "blas"), ((140.0, 131.0), "blas"), ((300.0, 131.0), "onednn")]
)
def test_auto_takes_onednn_only_where_it_measured_clearly_faster(monkeypatch, rates, chosen):
    """An AMD EPYC without AVX-512 (118 against 131 GFLOP/s) stays with the BLAS, and so does a tie."""
    monkeypatch.setattr(cpu_matmul, "measure_rates", lambda: rates)
    cpu_matmul.configure("auto")
    found = cpu_matmul.decision()
    assert found.backend == chosen and (found.onednn_gflops, found.blas_gflops) == rates
    assert found.metrics()["cpu_matmul"] == chosen and "GFLOP/s" in found.reason


def test_the_timing_measures_both_libraries():
    onednn, blas = cpu_matmul.measure_rates(repeats=1)
    assert onednn > 1 and blas > 1  # GFLOP/s of real products on this CPU


def test_an_unknown_choice_is_refused_in_one_sentence(monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV, "mkl")
    with pytest.raises(ValueError, match=r"^LIAR_CPU_MATMUL must be one of auto, onednn, blas, not 'mkl'$"):
        cpu_matmul.configure()
    assert cpu_matmul.backend() == "blas"


def test_a_failing_check_falls_back_to_the_blas(monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(cpu_matmul, "_onednn_op", lambda: broken)
    cpu_matmul.configure("onednn")
    assert cpu_matmul.backend() == "blas"
    x = torch.randn(4, 80, generator=g)
    torch.testing.assert_close(cpu_matmul.linear(x, W, B), F.linear(x, W, B))


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
    cpu_matmul.configure("blas")
    _, blas_logits, blas = _prune(llama_dir, corpus)
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
    assert inside == [0] * 2  # 2 blocks, each dense copy and pruned block timed together: no oneDNN product
    assert result.metrics["block_speedup"] > 0


def _with_blas(monkeypatch, fn):
    cpu_matmul.configure("blas")
    try:
        return fn()
    finally:
        cpu_matmul.configure("onednn")


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
