"""bench/flops.py: the product counter the CPU time page sets a prune against (docs/results/time.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.flops import ProductCounter


def _products(counter: ProductCounter) -> None:
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 16, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    q = torch.randn(2, 3, 16, 8, generator=g)
    with counter, torch.no_grad():
        for _ in range(3):  # the same projection three times: one distinct product
            F.linear(x, w, b)
        torch.bmm(x, x.transpose(1, 2))
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        gram = torch.zeros(24, 24)
        gram.addmm_(x.reshape(-1, 24).T, x.reshape(-1, 24))


def test_the_counter_counts_each_products_multiply_adds_from_its_shapes():
    counter = ProductCounter()
    _products(counter)
    expected = {
        "aten.addmm": 3 * 32 * 24 * 40,
        "aten.bmm": 2 * 16 * 24 * 16,
        "aten._scaled_dot_product_flash_attention_for_cpu": 2 * (2 * 3 * 16) * 16 * 8,
        "aten.addmm_": 24 * 32 * 24,
    }
    assert dict(counter.by_op) == expected
    assert counter.macs == sum(expected.values())
    assert not counter.calls  # shapes are kept only when asked for


def test_equal_products_share_one_replay_and_count_how_often_they_ran():
    counter = ProductCounter(shapes=True)
    _products(counter)
    counts = {key[0]: n for key, n in counter.calls.items()}
    assert counts == {
        "aten.addmm.default": 3,
        "aten.bmm.default": 1,
        "aten._scaled_dot_product_flash_attention_for_cpu.default": 1,
        "aten.addmm_.default": 1,
    }
    seconds, distinct = counter.replayed_seconds(repeats=1)
    assert distinct == 4 and seconds > 0


def test_a_replayed_operand_keeps_the_layout_it_was_called_with():
    """A transposed weight (F.linear's wᵀ) and an expanded operand (stride 0) replay with their strides."""
    counter = ProductCounter(shapes=True)
    with counter:
        torch.bmm(torch.randn(4, 5, 6), torch.randn(1, 6, 7).expand(4, 6, 7))
    ((_, args, _),) = counter.calls
    assert args[1] == ("tensor", (4, 6, 7), (0, 7, 1), torch.float32)
    assert counter.replayed_seconds(repeats=1)[1] == 1


def test_an_operand_without_strides_cannot_be_replayed():
    counter = ProductCounter(shapes=True)
    key = ("aten.mm.default", (("opaque", (4, 4), torch.float32), ("opaque", (4, 4), torch.float32)), ())
    counter.calls[key] += 1
    counter._ops[key] = (torch.ops.aten.mm.default, 64)
    with pytest.raises(ValueError, match="cannot replay aten.mm.default on plain tensors"):
        counter.replayed_seconds()
