"""Streaming statistics equal two-pass statistics computed on the concatenated activations."""

import pytest
import torch

from core.stats.accumulate import InputStats


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streaming_equals_two_pass_with_padding(dtype):
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(3, 7, 5, generator=gen) + 2.0 for _ in range(4)]
    masks = [torch.rand(3, 7, generator=gen) > 0.3 for _ in range(4)]
    stats = InputStats(5, dtype=dtype)
    for x, m in zip(batches, masks):
        stats.add_batch(x, m)
    real = torch.cat([x[m] for x, m in zip(batches, masks)]).double()  # padding removed up front
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(stats.gram.double(), real.T @ real, rtol=tol, atol=tol)
    torch.testing.assert_close(stats.sum.double(), real.sum(0), rtol=tol, atol=tol)
    assert stats.count == len(real)
    torch.testing.assert_close(stats.mean.double(), real.mean(0), rtol=tol, atol=tol)


def test_rejects_wrong_width_and_half_precision():
    with pytest.raises(ValueError, match="float32 or float64"):
        InputStats(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expected 4 input channels"):
        InputStats(4).add_batch(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="no tokens"):
        InputStats(4).mean  # noqa: B018


def test_half_precision_inputs_accumulate_in_float64():
    x = (torch.randn(64, 8) * 100).to(torch.bfloat16)
    stats = InputStats.from_tensor(x)
    ref = x.double()
    torch.testing.assert_close(stats.gram, ref.T @ ref)


@pytest.mark.parametrize(("c_in", "min_block"), [(17, 3), (700, 256), (9, 4)])
def test_block_triangular_gram_equals_full_product_when_read_between_batches(monkeypatch, c_in, min_block):
    """G is accumulated by upper column blocks and mirrored on read; reading it mid-stream and then
    adding more batches must still give the full two-pass XᵀX, exactly symmetric."""
    import core.stats.accumulate

    monkeypatch.setattr(core.stats.accumulate, "MIN_BLOCK", min_block)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(6, c_in, generator=gen, dtype=torch.float64) + 0.5 for _ in range(3)]
    stats = InputStats(c_in, dtype=torch.float64)
    assert len(stats._edges) > 2  # several blocks, uneven where c_in is not a multiple
    for i, x in enumerate(batches):
        stats.add_batch(x)
        seen = torch.cat(batches[: i + 1])
        torch.testing.assert_close(stats.gram, seen.T @ seen, rtol=1e-12, atol=1e-12)
        assert torch.equal(stats.gram, stats.gram.T)


def test_buffered_products_equal_two_pass_across_flushes(monkeypatch):
    """Batches are gathered and multiplied together every FLUSH_TOKENS(_CPU) tokens; reading G or s
    between flushes flushes the buffer. Any split must give the two-pass statistics."""
    import core.stats.accumulate

    monkeypatch.setattr(core.stats.accumulate, "FLUSH_TOKENS", 10)
    monkeypatch.setattr(core.stats.accumulate, "FLUSH_TOKENS_CPU", 10)
    gen = torch.Generator().manual_seed(2)
    batches = [torch.randn(int(n), 6, generator=gen, dtype=torch.float64) for n in (3, 4, 5, 9, 1, 12)]
    stats = InputStats(6, dtype=torch.float64)
    for i, x in enumerate(batches):
        stats.add_batch(x)
        if i == 2:  # a read mid-stream (with 2 tokens buffered) must not lose or double them
            seen = torch.cat(batches[:3])
            torch.testing.assert_close(stats.sum, seen.sum(0), rtol=1e-12, atol=1e-12)
    real = torch.cat(batches)
    torch.testing.assert_close(stats.gram, real.T @ real, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stats.mean, real.mean(0), rtol=1e-12, atol=1e-12)
    assert stats.count == len(real)


@pytest.mark.parametrize("backend", ["blas", "onednn"])
def test_float32_gram_across_folds_equals_float64_two_pass(monkeypatch, backend):
    """CPU float32 products through the BLAS accumulate in float32 block rows (``addmm_``) folded into
    the float64 totals every FOLD_TOKENS tokens; through oneDNN each flush's product is added at once.
    Either way, with flushes, folds and reads mid-stream in any order, G equals float64 XᵀX on the raw
    inputs to float32 rounding, exactly symmetric, and a read releases the float32 rows."""
    import core.stats.accumulate as acc
    from core.kernels import cpu_matmul

    monkeypatch.setattr(acc, "FLUSH_TOKENS_CPU", 16)
    monkeypatch.setattr(acc, "FOLD_TOKENS", 40)
    monkeypatch.setattr(acc, "MIN_BLOCK", 8)
    monkeypatch.setattr(cpu_matmul, "takes", lambda x, dtype=torch.float32: backend == "onednn")
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(int(n), 30, generator=gen) + 0.3 for n in (7, 16, 25, 3, 40, 11)]
    stats = InputStats(30, dtype=torch.float32)
    for i, x in enumerate(batches):
        stats.add_batch(x)
        if backend == "onednn":
            assert stats._acc is None and stats._acc_tokens == 0
        if i in (2, 4):  # reads mid-stream: folded, mirrored, the float32 rows released
            seen = torch.cat(batches[: i + 1]).double()
            torch.testing.assert_close(stats.gram, seen.T @ seen, rtol=1e-5, atol=1e-4)
            assert stats._acc is None and torch.equal(stats.gram, stats.gram.T)
    real = torch.cat(batches).double()
    torch.testing.assert_close(stats.gram, real.T @ real, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(stats.sum, real.sum(0), rtol=1e-5, atol=1e-4)
    assert stats.count == len(real)
